"""Qwen3-MoE sparse block: top-k token-choice router (softmax in float32, optional renormalisation of the
top-k probabilities) over SwiGLU experts, computed with sorted grouped matmuls
(clawjax/kernels/grouped_matmul/: megablox on TPU, Mosaic GPU on Hopper, `lax.ragged_dot` elsewhere):
each (token, choice) pair is sorted by expert, so the work is top_k expert MLPs per token, not n_experts,
and nothing of size tokens x experts x MLP is ever formed. No capacity limit and no token dropping, so the
output equals HF's per-expert loop exactly.

Routing replay (clawjax.models.routing): `MoE.forward(x, experts_BTK, replay_BT)` routes the tokens where
`replay_BT` holds to the given experts, with weights from the live router logits at them, and says where
its own top-k differed; it also returns the expert ids it used (what the rollout engine records).

Under the learner's mesh (logical axis rules active while tracing, as in `clawjax.sharding.under_mesh`)
the block runs per shard (`shard_map`), like attention: each device routes only its own tokens (split
over the batch axes), and computes only the experts it holds (split over "expert") on the slice of the
expert MLPs it holds (split over "mlp"); the tokens are the same on every device of an expert / tensor
group, whose partial outputs are summed (`psum`). The weights' FSDP-split "embed" dim is all-gathered
inside, one layer at a time. Without a mesh (the engine, eager calls) the same computation runs on
whole arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd
from jax.sharding import AbstractMesh, PartitionSpec as P

from clawjax.kernels.grouped_matmul import grouped_matmul
from clawjax.models.config import ModelConfig
from clawjax.models.layers import param
from clawjax.models.routing import top_k_routing
from clawjax.sharding import logical_to_mesh

GATE_AXES = ("expert", "embed", "mlp")  # gate and up: [E, D, F]
DOWN_AXES = ("expert", "mlp", "embed")  # [E, F, D]
ROUTER_AXES = ("embed", None)           # [D, E]


def router_logits(x_ND: jax.Array, router_DE: jax.Array) -> jax.Array:
  """[N, E] float32."""
  return jnp.einsum("nd,de->ne", x_ND, router_DE.astype(x_ND.dtype), preferred_element_type=jnp.float32)


def route(x_ND: jax.Array, router_DE: jax.Array, cfg: ModelConfig) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(router logits [N, E] float32, top-k weights [N, k] float32, top-k expert ids [N, k])."""
  logits_NE = router_logits(x_ND, router_DE)
  weights_NK, experts_NK, _ = top_k_routing(logits_NE, cfg)
  return logits_NE, weights_NK, experts_NK


@jax.custom_vjp
def permute_rows(x_MD: jax.Array, perm_M: jax.Array, inverse_M: jax.Array) -> jax.Array:
  """x[perm], whose gradient is the cotangent gathered by the inverse permutation: autodiff of a gather
  would scatter-add it instead (atomics on GPU, serialised on TPU)."""
  del inverse_M
  return x_MD[perm_M]


def _permute_rows_fwd(x_MD, perm_M, inverse_M):
  return permute_rows(x_MD, perm_M, inverse_M), (perm_M, inverse_M)


def _permute_rows_bwd(residuals, g_MD):
  perm_M, inverse_M = residuals
  return g_MD[inverse_M], None, None


permute_rows.defvjp(_permute_rows_fwd, _permute_rows_bwd)


def experts_output(x_ND: jax.Array, router_DE: jax.Array, gate_EDF: jax.Array, up_EDF: jax.Array,
                   down_EFD: jax.Array, cfg: ModelConfig, first_expert: jax.Array | int = 0) -> jax.Array:
  """sum over the top-k choices of weight x expert MLP(x) [N, D], counting only the experts held here:
  `first_expert` .. `first_expert` + E_here - 1 (E_here = gate_EDF.shape[0]); the other choices give 0.
  With every expert held (first_expert 0, E_here = n_experts) it is the whole block."""
  return routed_experts_output(x_ND, router_DE, gate_EDF, up_EDF, down_EFD, cfg, first_expert)[0]


def routed_experts_output(x_ND: jax.Array, router_DE: jax.Array, gate_EDF: jax.Array, up_EDF: jax.Array,
                          down_EFD: jax.Array, cfg: ModelConfig, first_expert: jax.Array | int = 0,
                          forced_NK: jax.Array | None = None, replay_N: jax.Array | None = None
                          ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`experts_output` with the expert ids `forced_NK` where `replay_N` (clawjax.models.routing): (output
  [N, D], the expert ids used [N, k], whether a replayed token's own top-k differs [N])."""
  n, d = x_ND.shape
  k, e_here = cfg.top_k, gate_EDF.shape[0]
  weights_NK, experts_NK, disagree_N = top_k_routing(router_logits(x_ND, router_DE), cfg, forced_NK, replay_N)
  # Renumbered so the experts held here come first: their pairs lead the sorted order, where the grouped
  # matmuls' groups cover them; the pairs of other experts trail, outside every group, where a kernel's
  # rows are undefined: grouped_matmul zeroes them (in its output, and in the tokens' gradient that
  # flows back through the permutation below), so other experts' choices add 0 here.
  local_NK = (experts_NK - first_expert) % cfg.n_experts
  order_M = jnp.argsort(local_NK.reshape(-1), stable=True)  # M = N * k (token, choice) pairs
  inverse_M = jnp.zeros_like(order_M).at[order_M].set(jnp.arange(n * k, dtype=order_M.dtype))
  x_MD = permute_rows(jnp.broadcast_to(x_ND[:, None], (n, k, d)).reshape(n * k, d), order_M, inverse_M)
  group_sizes_E = jnp.bincount(local_NK.reshape(-1), length=e_here).astype(jnp.int32)
  gate_MF = grouped_matmul(x_MD, gate_EDF.astype(cfg.dtype), group_sizes_E)
  up_MF = grouped_matmul(x_MD, up_EDF.astype(cfg.dtype), group_sizes_E)
  y_MD = grouped_matmul(jax.nn.silu(gate_MF) * up_MF, down_EFD.astype(cfg.dtype), group_sizes_E)
  y_NKD = permute_rows(y_MD, inverse_M, order_M).reshape(n, k, d)
  return jnp.einsum("nkd,nk->nd", y_NKD, weights_NK.astype(cfg.dtype)), experts_NK, disagree_N


def _axes(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def _spec_entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
  return axes if len(axes) > 1 else (axes[0] if axes else None)


class MoE(nnx.Module):
  """Callable on [B, T, D] like `MLP`; `route` exposes the router for load-balance metrics."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    d, e, f = cfg.d_model, cfg.n_experts, cfg.moe_mlp_dim
    # The router is small and read by every token: replicated rather than split over "expert".
    self.router = param(rngs, (d, e), ROUTER_AXES, cfg.param_dtype)
    self.gate = param(rngs, (e, d, f), GATE_AXES, cfg.param_dtype, fan_in=d)
    self.up = param(rngs, (e, d, f), GATE_AXES, cfg.param_dtype, fan_in=d)
    self.down = param(rngs, (e, f, d), DOWN_AXES, cfg.param_dtype, fan_in=f)

  def route(self, x_ND: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(router logits [N, E] float32, top-k weights [N, k] float32, top-k expert ids [N, k])."""
    return route(x_ND, self.router[...], self.cfg)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    return self.forward(x_BTD)[0]

  def replayed(self, x_BTD: jax.Array, experts_BTK: jax.Array, replay_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The block with the experts `experts_BTK` forced where `replay_BT`: (output, whether a replayed
    token's own top-k differs)."""
    y_BTD, _, disagree_BT = self.forward(x_BTD, experts_BTK, replay_BT)
    return y_BTD, disagree_BT

  def forward(self, x_BTD: jax.Array, experts_BTK: jax.Array | None = None, replay_BT: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(output [B, T, D], the expert ids used [B, T, k], disagree [B, T]), replaying as `replayed`."""
    cfg = self.cfg
    x_BTD = x_BTD.astype(cfg.dtype)
    weights = (self.router[...], self.gate[...], self.up[...], self.down[...])
    forced = () if experts_BTK is None else (experts_BTK, replay_BT)
    rules, mesh = spmd.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
      b, t, d = x_BTD.shape
      flat = tuple(a.reshape(b * t, *a.shape[2:]) for a in forced)
      y_ND, experts_NK, disagree_N = routed_experts_output(x_BTD.reshape(b * t, d), *weights, cfg, 0, *flat)
      return y_ND.reshape(b, t, d), experts_NK.reshape(b, t, -1), disagree_N.reshape(b, t)
    return self._per_shard(x_BTD, *weights, *forced, mesh=mesh, rules=rules)

  def _per_shard(self, x_BTD: jax.Array, router_DE: jax.Array, gate_EDF: jax.Array, up_EDF: jax.Array,
                 down_EFD: jax.Array, *forced: jax.Array, mesh: AbstractMesh, rules: Sequence[tuple[str, Any]]
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The block under a mesh: see the module docstring. `forced`: (experts_BTK, replay_BT) or ()."""
    cfg = self.cfg
    router_spec = logical_to_mesh(ROUTER_AXES, router_DE.shape, mesh, rules)
    gate_spec = logical_to_mesh(GATE_AXES, gate_EDF.shape, mesh, rules)
    down_spec = logical_to_mesh(DOWN_AXES, down_EFD.shape, mesh, rules)
    expert_axes, mlp_axes = _axes(gate_spec[0]), _axes(gate_spec[2])
    summed = expert_axes + mlp_axes  # each device's output is its experts' and MLP slice's share
    # Tokens split over the batch (and length) axes, but never over an axis that splits the experts or
    # their MLPs: every device of such a group must see the same tokens for the psum to add up.
    x_spec = logical_to_mesh(("batch", "length", None), x_BTD.shape, mesh, rules)
    x_spec = P(*(_spec_entry(tuple(a for a in _axes(e) if a not in summed)) for e in x_spec))

    def gather(w: jax.Array, spec: P, dim: int) -> jax.Array:
      axes = _axes(spec[dim])  # the FSDP split of "embed": whole rows for the matmuls
      return jax.lax.all_gather(w, axes, axis=dim, tiled=True) if axes else w

    # The replayed ids and flags, the ids used and the disagreement go with their tokens.
    token_spec = P(x_spec[0], x_spec[1])
    ids_spec = P(x_spec[0], x_spec[1], None)

    def one_shard(x_btD, router_dE, gate_edf, up_edf, down_efd, *forced_bt):
      b, t, d = x_btD.shape
      first_expert = jax.lax.axis_index(expert_axes) * gate_edf.shape[0] if expert_axes else 0
      flat = tuple(a.reshape(b * t, *a.shape[2:]) for a in forced_bt)
      out_nD, experts_nK, disagree_n = routed_experts_output(
          x_btD.reshape(b * t, d), gather(router_dE, router_spec, 0), gather(gate_edf, gate_spec, 1),
          gather(up_edf, gate_spec, 1), gather(down_efd, down_spec, 2), cfg, first_expert, *flat)
      out_nD = jax.lax.psum(out_nD, summed) if summed else out_nD
      return out_nD.reshape(b, t, d), experts_nK.reshape(b, t, -1), disagree_n.reshape(b, t)

    # check_vma off: the grouped matmuls' kernels (megablox, Mosaic GPU) declare outputs without the
    # varying-axes type that checking needs. Unchecked, shard_map's transpose sums an input's gradient
    # over the mesh axes its spec leaves out: the tokens' over the expert / tensor group, each device's
    # gradient being its part of the psum above (and that psum's transpose meets its output's cotangent
    # divided by the group's size), the router's over every axis but fsdp (whose gather transposes to a
    # reduce-scatter).
    forced_specs = (ids_spec, token_spec)[:len(forced)]
    return jax.shard_map(one_shard, mesh=mesh,
                         in_specs=(x_spec, router_spec, gate_spec, gate_spec, down_spec, *forced_specs),
                         out_specs=(x_spec, ids_spec, token_spec), check_vma=False)(
                             x_BTD, router_DE, gate_EDF, up_EDF, down_EFD, *forced)
