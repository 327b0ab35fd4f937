"""Log-probs and entropies of the loss tokens, computed chunk by chunk over the vocab projection.

The rollout log-prob convention (clawjax.calllog): log softmax(logits / T) over the full vocabulary at
the sampling temperature T, no top-p / top-k truncation. The learner reproduces exactly that.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def gather_rows(x_RTD: jax.Array, index_RK: jax.Array) -> jax.Array:
  """x[r, index[r, k]] -> [R, K, D]."""
  return jnp.take_along_axis(x_RTD, index_RK[..., None], axis=1)


def token_logprobs(logits_fn: Callable[[jax.Array], jax.Array], hidden_RKD: jax.Array,
                   targets_RK: jax.Array, temperature: float, chunk: int, entropy_grad: bool = False
                   ) -> tuple[jax.Array, jax.Array]:
  """(log p(target), entropy) of softmax(logits_fn(hidden) / temperature), each [R, K].

  K is cut into chunks of `chunk` slots; each chunk's logits are rematerialised in the backward pass,
  so at most [R, chunk, V] logits live at once. The entropy's gradient is stopped unless `entropy_grad`:
  even unused, it costs the backward pass ~25% more (the scan over chunks computes it with a zero
  cotangent)."""
  rows, k, d = hidden_RKD.shape
  if k % chunk:
    raise ValueError(f"loss slots K={k} must be a multiple of logits_chunk={chunk}")
  h_CRcD = hidden_RKD.reshape(rows, k // chunk, chunk, d).swapaxes(0, 1)
  t_CRc = targets_RK.reshape(rows, k // chunk, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one(h_RcD: jax.Array, t_Rc: jax.Array) -> tuple[jax.Array, jax.Array]:
    z_RcV = logits_fn(h_RcD).astype(jnp.float32) / temperature
    logp_RcV = jax.nn.log_softmax(z_RcV, axis=-1)
    logp = jnp.take_along_axis(logp_RcV, t_Rc[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_RcV) * logp_RcV, axis=-1)
    return logp, entropy if entropy_grad else jax.lax.stop_gradient(entropy)

  logp_CRc, ent_CRc = jax.lax.map(lambda a: one(*a), (h_CRcD, t_CRc))
  back = lambda x: x.swapaxes(0, 1).reshape(rows, k)
  return back(logp_CRc), back(ent_CRc)
