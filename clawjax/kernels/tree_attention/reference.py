"""The references of tree attention in plain jnp, the contract every kernel of the op keeps:
q [B, T, N, H], k/v [B, T, K, H] (GQA, after RoPE), the rows' segment ids and subtree ends [B, T] ->
o [B, T, N, H] under the mask rule of mask.py; a query that sees no key gives 0.

  dense_attention    materialises [B, N, T, T] scores on device: the reference the others are checked
                     against.
  blocked_attention  online softmax over key blocks (flash-attention style) with memory O(T * block)
                     forward and, through rematerialisation, per query block in the backward pass; key
                     blocks that no query of the block can see (after the queries, subtrees ended before
                     them, other segments) are skipped with `lax.cond`. Runs on any backend as plain XLA.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from clawjax.kernels.precision import einsum_f32
from clawjax.kernels.tree_attention.block_sparse import pad_to_block
from clawjax.kernels.tree_attention.mask import real, tree_mask
from clawjax.kernels.tree_attention.online_softmax import (NEG, online_softmax_init, online_softmax_result,
                                                           online_softmax_step)


def masked_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_BTS: jax.Array) -> jax.Array:
  """Softmax attention with GQA under an explicit mask; rows with no visible key give 0."""
  b, t, n, h = q_BTNH.shape
  kv = k_BSKH.shape[2]
  q_BTKGH = q_BTNH.reshape(b, t, kv, n // kv, h)
  scores_BKGTS = einsum_f32("btkgh,bskh->bkgts", q_BTKGH, k_BSKH) * h ** -0.5
  mask_B11TS = mask_BTS[:, None, None]
  probs_BKGTS = jnp.where(mask_B11TS, jax.nn.softmax(jnp.where(mask_B11TS, scores_BKGTS, NEG), axis=-1), 0.0)
  out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS.astype(v_BSKH.dtype), v_BSKH)
  return out_BTKGH.reshape(b, t, n, h)


def dense_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int) -> jax.Array:
  """The kernel signature: q [B, T, N, H], k/v [B, T, K, H] (after RoPE), the row's segment ids and
  subtree ends [B, T] -> o [B, T, N, H]. `block` is the tiling hint (unused here)."""
  del block
  b, t = segment_ids_BT.shape
  q_index_BT = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask_BTT = tree_mask(q_index_BT, segment_ids_BT, segment_ids_BT, subtree_end_BT)
  return masked_attention(q_BTNH, k_BTKH, v_BTKH, mask_BTT)


def block_needed(q_start, q_seg_BQ, k_start, k_seg_BK, k_end_BK, block: int) -> jax.Array:
  """Scalar bool: can any query of the block see any key of the block (conservative, in some row)?"""
  big = jnp.iinfo(jnp.int32).max
  q_lo = jnp.min(jnp.where(real(q_seg_BQ), q_seg_BQ, big), axis=1)
  q_hi = jnp.max(q_seg_BQ, axis=1)
  k_lo = jnp.min(jnp.where(real(k_seg_BK), k_seg_BK, big), axis=1)
  k_hi = jnp.max(k_seg_BK, axis=1)
  segments_overlap_B = (q_lo <= k_hi) & (k_lo <= q_hi)
  subtree_reaches_B = jnp.max(k_end_BK, axis=1) > q_start
  return (k_start < q_start + block) & jnp.any(segments_overlap_B & subtree_reaches_B)


def blocked_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int) -> jax.Array:
  """Same contract as `dense_attention`: an outer map over query blocks, an inner scan over key blocks
  with running (max, normaliser, accumulator); both bodies rematerialised in the backward pass."""
  b, t, n, h = q_BTNH.shape
  kv = k_BTKH.shape[2]
  g = n // kv
  pad = -t % block
  q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT = pad_to_block(
      pad, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT)
  nb = (t + pad) // block
  scale = h ** -0.5
  # Leading block axis for scan/map: [nb, B, block, ...].
  q_nBQKGH = q_BTNH.reshape(b, nb, block, kv, g, h).swapaxes(0, 1)
  k_nBKKH = k_BTKH.reshape(b, nb, block, kv, h).swapaxes(0, 1)
  v_nBKKH = v_BTKH.reshape(b, nb, block, kv, h).swapaxes(0, 1)
  seg_nBQ = segment_ids_BT.reshape(b, nb, block).swapaxes(0, 1)
  end_nBQ = subtree_end_BT.reshape(b, nb, block).swapaxes(0, 1)
  starts_n = jnp.arange(nb) * block
  offsets = jnp.arange(block)

  @jax.checkpoint
  def one_query_block(args):
    q_start, q_BQKGH, q_seg_BQ = args
    q_index_BQ = jnp.broadcast_to(q_start + offsets, (b, block))

    @jax.checkpoint
    def kv_step(carry, kv_args):
      k_start, k_BKKH, v_BKKH, k_seg_BK, k_end_BK = kv_args

      def update(carry):
        mask_B11QK = tree_mask(q_index_BQ, q_seg_BQ, k_seg_BK, k_end_BK, k_start)[:, None, None]
        s_BKGQK = einsum_f32("bqkgh,bskh->bkgqs", q_BQKGH, k_BKKH) * scale
        return online_softmax_step(carry, s_BKGQK, mask_B11QK, v_BKKH)

      needed = block_needed(q_start, q_seg_BQ, k_start, k_seg_BK, k_end_BK, block)
      return jax.lax.cond(needed, update, lambda c: c, carry), None

    init = online_softmax_init((b, kv, g, block), h)
    carry, _ = jax.lax.scan(kv_step, init, (starts_n, k_nBKKH, v_nBKKH, seg_nBQ, end_nBQ))
    out_BKGQH = online_softmax_result(carry)
    return jnp.einsum("bkgqh->bqkgh", out_BKGQH).astype(q_BQKGH.dtype)

  out_nBQKGH = jax.lax.map(one_query_block, (starts_n, q_nBQKGH, seg_nBQ))
  return out_nBQKGH.swapaxes(0, 1).reshape(b, t + pad, n, h)[:, :t]
