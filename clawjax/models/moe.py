"""Qwen3-MoE sparse block: top-k token-choice router (softmax in float32, optional renormalisation of the
top-k probabilities) over SwiGLU experts, computed with sorted grouped matmuls (`jax.lax.ragged_dot`):
each (token, choice) pair is sorted by expert, so the work is top_k expert MLPs per token, not n_experts.
No capacity limit and no token dropping, so the output equals HF's per-expert loop exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from clawjax.models.config import ModelConfig
from clawjax.models.layers import constrain, param


class MoE(nnx.Module):
  """Callable on [B, T, D] like `MLP`; `route` exposes the router for load-balance metrics."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, e, f = cfg.d_model, cfg.n_experts, cfg.moe_mlp_dim
    # The router is small and read by every token: replicated rather than split over "expert".
    self.router = param(rngs, (d, e), ("embed", None), cfg.param_dtype)
    self.gate = param(rngs, (e, d, f), ("expert", "embed", "mlp"), cfg.param_dtype, fan_in=d)
    self.up = param(rngs, (e, d, f), ("expert", "embed", "mlp"), cfg.param_dtype, fan_in=d)
    self.down = param(rngs, (e, f, d), ("expert", "mlp", "embed"), cfg.param_dtype, fan_in=f)

  def route(self, x_ND: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(router logits [N, E] float32, top-k weights [N, k] float32, top-k expert ids [N, k])."""
    logits_NE = jnp.einsum("nd,de->ne", x_ND, self.router[...].astype(x_ND.dtype),
                           preferred_element_type=jnp.float32)
    weights_NK, experts_NK = jax.lax.top_k(jax.nn.softmax(logits_NE, axis=-1), self.cfg.top_k)
    if self.cfg.norm_topk_prob:
      weights_NK = weights_NK / jnp.sum(weights_NK, axis=-1, keepdims=True)
    return logits_NE, weights_NK, experts_NK

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    cfg = self.cfg
    b, t, d = x_BTD.shape
    x_ND = x_BTD.astype(cfg.dtype).reshape(b * t, d)
    _, weights_NK, experts_NK = self.route(x_ND)
    k = cfg.top_k
    order_M = jnp.argsort(experts_NK.reshape(-1), stable=True)  # M = N * k (token, choice) pairs
    x_MD = x_ND[order_M // k]
    group_sizes_E = jnp.bincount(experts_NK.reshape(-1), length=cfg.n_experts).astype(jnp.int32)
    gate_MF = jax.lax.ragged_dot(x_MD, self.gate[...].astype(cfg.dtype), group_sizes_E)
    up_MF = jax.lax.ragged_dot(x_MD, self.up[...].astype(cfg.dtype), group_sizes_E)
    # Expert MLPs tensor-parallel over "mlp" like the dense MLP; the sort by expert is over all tokens.
    h_MF = constrain(jax.nn.silu(gate_MF) * up_MF, (None, "mlp"))
    y_MD = jax.lax.ragged_dot(h_MF, self.down[...].astype(cfg.dtype), group_sizes_E)
    y_NKD = jnp.zeros_like(y_MD).at[order_M].set(y_MD).reshape(b * t, k, d)
    out_ND = jnp.einsum("nkd,nk->nd", y_NKD, weights_NK.astype(cfg.dtype))
    return out_ND.reshape(b, t, d)
