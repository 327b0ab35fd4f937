"""Tree attention on TPU: the block-sparse flash-attention kernel as Mosaic (dispatch.py picks it when
lowering for TPU, and runs it in Pallas interpret mode on a CPU).

Same contract and mask rule as `reference.dense_attention`. Block sparsity as in block_sparse.py: the
lists of visible blocks are scalar-prefetched, so the grid's key axis walks a list: index maps fetch only
visible blocks, and a step past the list's end repeats the last block index (no new DMA) and skips its
body. The backward pass walks the transposed lists (visible query blocks per key block) for dK/dV and the
forward pass's lists for dQ, recomputing the probabilities from the saved logsumexp: nothing of size
[T, T].

GQA: a grid step holds the G query heads of one KV head, so a key/value block is fetched once for the
group; dK/dV sum the group's heads in the kernel.

Numerics: inputs in their dtype (bf16 on TPU), matmuls accumulate in f32, softmax statistics and
accumulators are f32 scratch.

Scalar-prefetch size: each kernel's list takes B * nq^2 int32 of SMEM (nq = padded T / block), per
device: at a 64K-token row 64 KiB per row at block 512 (the default), 1 MiB at block 256.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from clawjax.kernels.tree_attention.block_sparse import pad_to_block, visible_lists
from clawjax.kernels.tree_attention.mask import visible as mask_rule
from clawjax.kernels.tree_attention.online_softmax import NEG as _NEG
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def _column(row_1Q: jax.Array) -> jax.Array:
  """(1, Q) f32 -> (Q, 1). Per-query values travel as lane-dense rows: a [.., T, 1] array would be padded
  to 128 lanes in TPU memory (a 64K-token row's logsumexp per head: 32 MiB instead of 256 KiB)."""
  return jnp.broadcast_to(row_1Q, (128, row_1Q.shape[1])).T[:, :1]


def _row(column_Q1: jax.Array) -> jax.Array:
  """(Q, 1) f32 -> (1, Q), the inverse of `_column`."""
  return jnp.broadcast_to(column_Q1, (column_Q1.shape[0], 128)).T[:1, :]


def _mask(q_seg_1Q, q_start, k_seg_1K, k_end_1K, k_start) -> jax.Array:
  """[Q, K] bool: the mask rule on one (query block, key block) tile (query segment ids as f32)."""
  q_seg_Q1 = _column(q_seg_1Q).astype(jnp.int32)
  q_index_Q1 = q_start + jax.lax.broadcasted_iota(jnp.int32, q_seg_Q1.shape, 0)
  k_index_1K = k_start + jax.lax.broadcasted_iota(jnp.int32, k_seg_1K.shape, 1)
  return mask_rule(q_seg_Q1, q_index_Q1, k_seg_1K, k_index_1K, k_end_1K)


def _walk(list_ref, count_ref, seg_refs, *, block: int, nq: int, outer_is_query: bool, init, visible,
          finish) -> None:
  """The grid's last axis walks the outer block's (axis 2) list of visible inner blocks: `init()` at the
  first step, `visible(mask_QK)` at each step within the list, `finish()` at the last step."""
  step, outer = pl.program_id(3), pl.program_id(2)
  row = pl.program_id(0) * nq + outer
  pl.when(step == 0)(init)

  @pl.when(step < count_ref[row])
  def _visible_block():
    inner = list_ref[row * nq + step]
    qi, kj = (outer, inner) if outer_is_query else (inner, outer)
    q_seg_ref, k_seg_ref, k_end_ref = seg_refs
    visible(_mask(q_seg_ref[...], qi * block, k_seg_ref[...], k_end_ref[...], kj * block))

  pl.when(step == pl.num_programs(3) - 1)(finish)


def _forward_kernel(kv_list_ref, count_ref, q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, k_end_ref,
                    o_ref, lse_ref, m_scr, l_scr, acc_scr, *, block: int, nq: int, scale: float):
  """Grid (row, KV head, query block, step over its visible key blocks); q/o blocks hold the G query
  heads of the KV head, so a key/value block is fetched once for the group."""

  def init():
    m_scr[...] = jnp.full(m_scr.shape, _NEG, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  def visible(mask_QK):
    k_KH, v_KH = k_ref[...], v_ref[...]
    for g in range(q_ref.shape[0]):
      s_QK = jax.lax.dot_general(q_ref[g], k_KH, _NT, preferred_element_type=jnp.float32) * scale
      s_QK = jnp.where(mask_QK, s_QK, _NEG)
      m_prev_Q1 = m_scr[g]
      m_new_Q1 = jnp.maximum(m_prev_Q1, jnp.max(s_QK, axis=1, keepdims=True))
      p_QK = jnp.where(mask_QK, jnp.exp(s_QK - m_new_Q1), 0.0)
      correction_Q1 = jnp.exp(m_prev_Q1 - m_new_Q1)
      l_scr[g] = l_scr[g] * correction_Q1 + jnp.sum(p_QK, axis=1, keepdims=True)
      pv_QH = jnp.dot(p_QK.astype(v_KH.dtype), v_KH, preferred_element_type=jnp.float32)
      acc_scr[g] = acc_scr[g] * correction_Q1 + pv_QH
      m_scr[g] = m_new_Q1

  def finish():
    for g in range(q_ref.shape[0]):
      l_Q1 = l_scr[g]
      seen_Q1 = l_Q1 > 0
      o_ref[g] = (acc_scr[g] / jnp.where(seen_Q1, l_Q1, 1.0)).astype(o_ref.dtype)
      # Rows that saw nothing: any finite value; the backward pass masks them out anyway.
      lse_ref[g] = _row(jnp.where(seen_Q1, m_scr[g] + jnp.log(jnp.where(seen_Q1, l_Q1, 1.0)), 0.0))

  _walk(kv_list_ref, count_ref, (q_seg_ref, k_seg_ref, k_end_ref), block=block, nq=nq, outer_is_query=True,
        init=init, visible=visible, finish=finish)


def _probs_and_dscores(q_QH, k_KH, v_KH, do_QH, lse_1Q, delta_1Q, mask_QK, scale: float):
  """Recomputed probabilities P and the scores' gradient dS = P * (dO V^T - delta) of one tile (f32)."""
  s_QK = jax.lax.dot_general(q_QH, k_KH, _NT, preferred_element_type=jnp.float32) * scale
  p_QK = jnp.where(mask_QK, jnp.exp(s_QK - _column(lse_1Q)), 0.0)
  dp_QK = jax.lax.dot_general(do_QH, v_KH, _NT, preferred_element_type=jnp.float32)
  return p_QK, p_QK * (dp_QK - _column(delta_1Q))


def _dq_kernel(kv_list_ref, count_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref,
               k_seg_ref, k_end_ref, dq_ref, dq_scr, *, block: int, nq: int, scale: float):
  """The forward pass's grid and lists; dQ of the group's G query heads."""

  def init():
    dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

  def visible(mask_QK):
    k_KH, v_KH = k_ref[...], v_ref[...]
    for g in range(q_ref.shape[0]):
      _, ds_QK = _probs_and_dscores(q_ref[g], k_KH, v_KH, do_ref[g], lse_ref[g], delta_ref[g], mask_QK, scale)
      dq_scr[g] += jnp.dot(ds_QK.astype(k_KH.dtype), k_KH, preferred_element_type=jnp.float32)

  def finish():
    dq_ref[...] = (dq_scr[...] * scale).astype(dq_ref.dtype)

  _walk(kv_list_ref, count_ref, (q_seg_ref, k_seg_ref, k_end_ref), block=block, nq=nq, outer_is_query=True,
        init=init, visible=visible, finish=finish)


def _dkv_kernel(q_list_ref, count_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref,
                k_seg_ref, k_end_ref, dk_ref, dv_ref, dk_scr, dv_scr, *, block: int, nq: int, scale: float):
  """Grid (row, KV head, key block, step over the query blocks that see it); the group's G query heads
  accumulate into the KV head's dK and dV."""

  def init():
    dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
    dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

  def visible(mask_QK):
    k_KH, v_KH = k_ref[...], v_ref[...]
    for g in range(q_ref.shape[0]):
      q_QH, do_QH = q_ref[g], do_ref[g]
      p_QK, ds_QK = _probs_and_dscores(q_QH, k_KH, v_KH, do_QH, lse_ref[g], delta_ref[g], mask_QK, scale)
      dv_scr[...] += jax.lax.dot_general(p_QK.astype(do_QH.dtype), do_QH, _TN, preferred_element_type=jnp.float32)
      dk_scr[...] += jax.lax.dot_general(ds_QK.astype(q_QH.dtype), q_QH, _TN, preferred_element_type=jnp.float32)

  def finish():
    dk_ref[...] = (dk_scr[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)

  _walk(q_list_ref, count_ref, (q_seg_ref, k_seg_ref, k_end_ref), block=block, nq=nq, outer_is_query=False,
        init=init, visible=visible, finish=finish)


class _Layout:
  """Kernel-side arrays of one call besides q/k/v: segment ids and subtree ends as rows [B, 1, T] (the
  queries' segment ids as f32, turned into a column in the kernel), and the compacted lists."""

  def __init__(self, segment_ids_BT: jax.Array, subtree_end_BT: jax.Array, block: int):
    self.block = block
    self.nq = segment_ids_BT.shape[1] // block
    lists = visible_lists(segment_ids_BT, subtree_end_BT, block)
    # Flat 1-D prefetch arrays: SMEM pads the minor dimension of 2-D arrays.
    self.kv_list, self.kv_count = lists.kv_list_Bqk.reshape(-1), lists.kv_count_Bq.reshape(-1)
    self.q_list, self.q_count = lists.q_list_Bkq.reshape(-1), lists.q_count_Bk.reshape(-1)
    self.q_seg_B1T = segment_ids_BT[:, None, :].astype(jnp.float32)  # exact below 2^24 segments
    self.k_seg_B1T = segment_ids_BT[:, None, :]
    self.k_end_B1T = subtree_end_BT[:, None, :]


def _seg_specs(block: int, q_block, k_block) -> list[pl.BlockSpec]:
  """Block specs of the (q segment, k segment, k subtree end) rows; q_block / k_block map the grid indices
  (and prefetch refs) to the query / key block index."""
  return [pl.BlockSpec((None, 1, block), lambda *a: (a[0], 0, q_block(*a))),
          pl.BlockSpec((None, 1, block), lambda *a: (a[0], 0, k_block(*a))),
          pl.BlockSpec((None, 1, block), lambda *a: (a[0], 0, k_block(*a)))]


def _call(kernel, grid, in_specs, out_specs, out_shape, scratch, semantics, interpret: bool, name: str):
  return pl.pallas_call(
      kernel, out_shape=out_shape, interpret=interpret, name=name,
      grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                             out_specs=out_specs, scratch_shapes=scratch),
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


def _forward(lay: _Layout, q_BKGTH, k_BKTH, v_BKTH, interpret: bool):
  b, kv, groups, t, h = q_BKGTH.shape
  blk, nq = lay.block, lay.nq
  kv_block = lambda bi, ki, qi, s, kv_list, count: kv_list[(bi * nq + qi) * nq + s]
  q_spec = pl.BlockSpec((None, None, groups, blk, h), lambda bi, ki, qi, s, *_: (bi, ki, 0, qi, 0))
  kv_spec = pl.BlockSpec((None, None, blk, h), lambda *a: (a[0], a[1], kv_block(*a), 0))
  stat_spec = pl.BlockSpec((None, None, groups, 1, blk), lambda bi, ki, qi, s, *_: (bi, ki, 0, 0, qi))
  kernel = functools.partial(_forward_kernel, block=blk, nq=nq, scale=h ** -0.5)
  return _call(
      kernel, (b, kv, nq, nq), [q_spec, kv_spec, kv_spec] + _seg_specs(blk, lambda bi, ki, qi, *_: qi, kv_block),
      [q_spec, stat_spec],
      [jax.ShapeDtypeStruct(q_BKGTH.shape, q_BKGTH.dtype), jax.ShapeDtypeStruct((b, kv, groups, 1, t), jnp.float32)],
      [pltpu.VMEM((groups, blk, 1), jnp.float32), pltpu.VMEM((groups, blk, 1), jnp.float32),
       pltpu.VMEM((groups, blk, h), jnp.float32)],
      ("parallel", "parallel", "parallel", "arbitrary"), interpret, "tree_attention_forward",
  )(lay.kv_list, lay.kv_count, q_BKGTH, k_BKTH, v_BKTH, lay.q_seg_B1T, lay.k_seg_B1T, lay.k_end_B1T)


def _backward(lay: _Layout, q_BKGTH, k_BKTH, v_BKTH, o_BKGTH, lse_BKG1T, do_BKGTH, interpret: bool):
  b, kv, groups, t, h = q_BKGTH.shape
  blk, nq = lay.block, lay.nq
  kernel_args = dict(block=blk, nq=nq, scale=h ** -0.5)
  # delta_i = sum_h dO_ih O_ih = sum_j P_ij dP_ij: the softmax's backward correction per query.
  delta_BKG1T = jnp.sum(do_BKGTH.astype(jnp.float32) * o_BKGTH.astype(jnp.float32), axis=-1)[..., None, :]
  operands = (q_BKGTH, k_BKTH, v_BKTH, do_BKGTH, lse_BKG1T, delta_BKG1T, lay.q_seg_B1T, lay.k_seg_B1T, lay.k_end_B1T)
  semantics = ("parallel", "parallel", "parallel", "arbitrary")

  # dQ: the forward pass's grid, over each query block's visible key blocks.
  kv_block = lambda bi, ki, qi, s, kv_list, count: kv_list[(bi * nq + qi) * nq + s]
  q_spec = pl.BlockSpec((None, None, groups, blk, h), lambda bi, ki, qi, s, *_: (bi, ki, 0, qi, 0))
  kv_spec = pl.BlockSpec((None, None, blk, h), lambda *a: (a[0], a[1], kv_block(*a), 0))
  stat_spec = pl.BlockSpec((None, None, groups, 1, blk), lambda bi, ki, qi, s, *_: (bi, ki, 0, 0, qi))
  dq_BKGTH = _call(
      functools.partial(_dq_kernel, **kernel_args), (b, kv, nq, nq),
      [q_spec, kv_spec, kv_spec, q_spec, stat_spec, stat_spec]
      + _seg_specs(blk, lambda bi, ki, qi, *_: qi, kv_block),
      q_spec, jax.ShapeDtypeStruct(q_BKGTH.shape, q_BKGTH.dtype), [pltpu.VMEM((groups, blk, h), jnp.float32)],
      semantics, interpret, "tree_attention_dq",
  )(lay.kv_list, lay.kv_count, *operands)

  # dK, dV: over each key block's visible query blocks (the transposed table).
  q_block = lambda bi, ki, kj, s, q_list, count: q_list[(bi * nq + kj) * nq + s]
  qt_spec = pl.BlockSpec((None, None, groups, blk, h), lambda *a: (a[0], a[1], 0, q_block(*a), 0))
  k_spec = pl.BlockSpec((None, None, blk, h), lambda bi, ki, kj, s, *_: (bi, ki, kj, 0))
  stat_t_spec = pl.BlockSpec((None, None, groups, 1, blk), lambda *a: (a[0], a[1], 0, 0, q_block(*a)))
  dk_BKTH, dv_BKTH = _call(
      functools.partial(_dkv_kernel, **kernel_args), (b, kv, nq, nq),
      [qt_spec, k_spec, k_spec, qt_spec, stat_t_spec, stat_t_spec]
      + _seg_specs(blk, q_block, lambda bi, ki, kj, *_: kj),
      [k_spec, k_spec],
      [jax.ShapeDtypeStruct(k_BKTH.shape, k_BKTH.dtype), jax.ShapeDtypeStruct(v_BKTH.shape, v_BKTH.dtype)],
      [pltpu.VMEM((blk, h), jnp.float32), pltpu.VMEM((blk, h), jnp.float32)],
      semantics, interpret, "tree_attention_dkv",
  )(lay.q_list, lay.q_count, *operands)
  return dq_BKGTH, dk_BKTH, dv_BKTH


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attend(q_BKGTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, block: int, interpret: bool):
  return _forward(_Layout(segment_ids_BT, subtree_end_BT, block), q_BKGTH, k_BKTH, v_BKTH, interpret)[0]


def _attend_fwd(q_BKGTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, block, interpret):
  o_BKGTH, lse_BKG1T = _forward(_Layout(segment_ids_BT, subtree_end_BT, block), q_BKGTH, k_BKTH, v_BKTH, interpret)
  return o_BKGTH, (q_BKGTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, o_BKGTH, lse_BKG1T)


def _attend_bwd(block, interpret, residuals, do_BKGTH):
  q_BKGTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, o_BKGTH, lse_BKG1T = residuals
  lay = _Layout(segment_ids_BT, subtree_end_BT, block)
  dq, dk, dv = _backward(lay, q_BKGTH, k_BKTH, v_BKTH, o_BKGTH, lse_BKG1T, do_BKGTH, interpret)
  return dq, dk, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def tpu_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int,
                  interpret: bool) -> jax.Array:
  """The kernel contract of `reference.dense_attention`. `block`: query and key block (a multiple of 128
  for Mosaic; small blocks are fine in interpret mode). `interpret`: Pallas interpret mode (any backend)
  instead of Mosaic (TPU only)."""
  b, t, n, h = q_BTNH.shape
  kv = k_BTKH.shape[2]
  pad = -t % block
  q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT = pad_to_block(
      pad, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT)
  # Kernel layout: heads-major, a KV head's query heads together ([B, K, G, T, H]).
  q_BKGTH = q_BTNH.reshape(b, t + pad, kv, n // kv, h).transpose(0, 2, 3, 1, 4)
  o_BKGTH = _attend(q_BKGTH, k_BTKH.transpose(0, 2, 1, 3), v_BTKH.transpose(0, 2, 1, 3),
                    segment_ids_BT.astype(jnp.int32), subtree_end_BT.astype(jnp.int32), block, interpret)
  return o_BKGTH.transpose(0, 3, 1, 2, 4).reshape(b, t + pad, n, h)[:, :t]
