"""The flash-attention softmax, one key block at a time: a running max, normaliser and accumulator per
query. The "blocked" reference runs it over the key blocks of a query block, the engine's attention to
long caches over the cache's blocks (through clawjax/models/attention.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from clawjax.kernels.precision import einsum_f32

NEG = -1e30  # finite "minus infinity": keeps fully masked rows free of NaN

OnlineSoftmax = tuple[jax.Array, jax.Array, jax.Array]  # running max, normaliser [B, K, G, Q]; accumulator [B, K, G, Q, H]


def online_softmax_init(shape_BKGQ: tuple[int, ...], head_dim: int) -> OnlineSoftmax:
  return (jnp.full(shape_BKGQ, NEG, jnp.float32), jnp.zeros(shape_BKGQ, jnp.float32),
          jnp.zeros((*shape_BKGQ, head_dim), jnp.float32))


def online_softmax_step(carry: OnlineSoftmax, s_BKGQS: jax.Array, mask_B11QS: jax.Array,
                        v_BSKH: jax.Array) -> OnlineSoftmax:
  """One key block of a flash-attention softmax: float32 scores [B, K, G, Q, S] of the block's keys, which
  of them each query sees, and their values."""
  m_BKGQ, l_BKGQ, acc_BKGQH = carry
  s_BKGQS = jnp.where(mask_B11QS, s_BKGQS, NEG)
  m_new = jnp.maximum(m_BKGQ, jnp.max(s_BKGQS, axis=-1))
  p_BKGQS = jnp.where(mask_B11QS, jnp.exp(s_BKGQS - m_new[..., None]), 0.0)
  correction = jnp.exp(m_BKGQ - m_new)
  pv_BKGQH = einsum_f32("bkgqs,bskh->bkgqh", p_BKGQS.astype(v_BSKH.dtype), v_BSKH)
  return m_new, l_BKGQ * correction + jnp.sum(p_BKGQS, axis=-1), acc_BKGQH * correction[..., None] + pv_BKGQH


def online_softmax_result(carry: OnlineSoftmax) -> jax.Array:
  """[B, K, G, Q, H] float32 attention outputs; 0 for a query that saw no key."""
  _, l_BKGQ, acc_BKGQH = carry
  return acc_BKGQH / jnp.where(l_BKGQ > 0, l_BKGQ, 1.0)[..., None]
