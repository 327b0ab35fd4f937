"""Tree attention as a block-sparse Pallas flash-attention kernel (`KERNELS["pallas"]`).

Same contract and mask rule as `attention.dense_attention`: q [B, T, N, H], k/v [B, T, K, H] (GQA),
segment ids and subtree ends [B, T]; key j is visible to query i iff segment[i] == segment[j] != 0 and
j <= i < subtree_end[j]. Rows with no visible key give 0.

Block sparsity: with one block size for queries and keys, the keys of key block kj reach query block qi
iff kj <= qi and some real key of kj has subtree_end > qi * block (a key's subtree never leaves its tree,
so the segment test adds nothing at block granularity). That table is computed on device per row and
compacted into, for every (row, query block), the list of visible key blocks and its length; both are
scalar-prefetched, so the grid's key axis walks the list: index maps fetch only visible blocks, and a
step past the list's end repeats the last block index (no new DMA) and skips its body. The backward
pass walks the transposed table (visible query blocks per key block) for dK/dV and the same lists as the
forward pass for dQ, recomputing the probabilities from the saved logsumexp: nothing of size [T, T].

Numerics: inputs in their dtype (bf16 on TPU), matmuls accumulate in f32, softmax statistics and
accumulators are f32 scratch.

Platforms: lowered for TPU it is a Mosaic kernel; on any other backend the same kernel runs in Pallas
interpret mode (`lax.platform_dependent` picks per lowering platform, so a jit compiled for a TPU
topology from a CPU host gets the Mosaic kernel). No GPU (Triton/Mosaic GPU) kernel: a GPU runs the
interpreter, correct but slow; use "blocked" there.

Scalar-prefetch size: the lists take B * nq * nq int32 of SMEM (nq = padded T / block); at block 512 and
a 64K-token row that is 64 KiB per row on a device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

_NEG = -1e30  # finite "minus infinity", as in attention.py: fully masked rows stay free of NaN
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b


def block_table(segment_ids_BT: jax.Array, subtree_end_BT: jax.Array, block: int) -> jax.Array:
  """[B, nq, nq] bool: can any query of block qi see any key of block kj? T must be a multiple of block.
  Exact up to the segment test, which a key's subtree (inside its own tree) already implies."""
  b, t = segment_ids_BT.shape
  nb = t // block
  reach_BT = jnp.where(segment_ids_BT > 0, subtree_end_BT, 0)
  reach_Bk = jnp.max(reach_BT.reshape(b, nb, block), axis=2)  # furthest query any key of the block reaches
  blocks = jnp.arange(nb)
  q_1q1, k_11k = blocks[None, :, None], blocks[None, None, :]
  return (k_11k <= q_1q1) & (reach_Bk[:, None, :] > q_1q1 * block)


def compact(table_Bqk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per (row, outer block): the visible inner blocks in ascending order, then the last one repeated (so
  a step past the end fetches nothing new), and their count. ([B, nq, nk] int32, [B, nq] int32)."""
  nk = table_Bqk.shape[2]
  count_Bq = jnp.sum(table_Bqk, axis=2, dtype=jnp.int32)
  # A stable sort of "invisible" flags puts the visible block indices first, in order.
  order_Bqk = jnp.argsort(~table_Bqk, axis=2, stable=True).astype(jnp.int32)
  last_Bq1 = jnp.take_along_axis(order_Bqk, jnp.maximum(count_Bq - 1, 0)[..., None], axis=2)
  steps_11k = jnp.arange(nk)[None, None, :]
  return jnp.where(steps_11k < count_Bq[..., None], order_Bqk, last_Bq1), count_Bq


def pallas_attention_flops(visible_blocks: int | jax.Array, block: int, head_dim: int, n_heads: int,
                           backward: bool = True) -> float:
  """Analytical FLOPs of the kernel (cost analysis cannot see inside it). `visible_blocks`: visible
  (query block, key block) pairs summed over rows (`block_table(...).sum()`). Forward: QK^T and PV,
  2 * 2 * block^2 * head_dim per pair and query head; backward: recomputed QK^T plus dP, dQ, dK, dV, 2.5x
  the forward."""
  forward = 4.0 * float(visible_blocks) * block * block * head_dim * n_heads
  return forward * 3.5 if backward else forward


def _mask(q_seg_Q1, q_start, k_seg_1K, k_end_1K, k_start) -> jax.Array:
  """[Q, K] bool: the mask rule on one (query block, key block) tile."""
  q_index_Q1 = q_start + jax.lax.broadcasted_iota(jnp.int32, q_seg_Q1.shape, 0)
  k_index_1K = k_start + jax.lax.broadcasted_iota(jnp.int32, k_seg_1K.shape, 1)
  return ((q_seg_Q1 == k_seg_1K) & (q_seg_Q1 != 0) & (k_index_1K <= q_index_Q1) & (q_index_Q1 < k_end_1K))


def _forward_kernel(kv_list_ref, count_ref, q_ref, k_ref, v_ref, q_seg_ref, k_seg_ref, k_end_ref,
                    o_ref, lse_ref, m_scr, l_scr, acc_scr, *, block: int, nq: int, scale: float):
  b, qi, step = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  row = b * nq + qi

  @pl.when(step == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, _NEG, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  @pl.when(step < count_ref[row])
  def _visible_block():
    kj = kv_list_ref[row * nq + step]
    mask_QK = _mask(q_seg_ref[...], qi * block, k_seg_ref[...], k_end_ref[...], kj * block)
    s_QK = jax.lax.dot_general(q_ref[...], k_ref[...], _NT, preferred_element_type=jnp.float32) * scale
    s_QK = jnp.where(mask_QK, s_QK, _NEG)
    m_prev_Q1 = m_scr[...]
    m_new_Q1 = jnp.maximum(m_prev_Q1, jnp.max(s_QK, axis=1, keepdims=True))
    p_QK = jnp.where(mask_QK, jnp.exp(s_QK - m_new_Q1), 0.0)
    correction_Q1 = jnp.exp(m_prev_Q1 - m_new_Q1)
    l_scr[...] = l_scr[...] * correction_Q1 + jnp.sum(p_QK, axis=1, keepdims=True)
    pv_QH = jnp.dot(p_QK.astype(v_ref.dtype), v_ref[...], preferred_element_type=jnp.float32)
    acc_scr[...] = acc_scr[...] * correction_Q1 + pv_QH
    m_scr[...] = m_new_Q1

  @pl.when(step == pl.num_programs(3) - 1)
  def _finish():
    l_Q1 = l_scr[...]
    seen_Q1 = l_Q1 > 0
    o_ref[...] = (acc_scr[...] / jnp.where(seen_Q1, l_Q1, 1.0)).astype(o_ref.dtype)
    # Rows that saw nothing: any finite value; the backward pass masks them out anyway.
    lse_ref[...] = jnp.where(seen_Q1, m_scr[...] + jnp.log(jnp.where(seen_Q1, l_Q1, 1.0)), 0.0)


def _dq_kernel(kv_list_ref, count_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref,
               k_seg_ref, k_end_ref, dq_ref, dq_scr, *, block: int, nq: int, scale: float):
  b, qi, step = pl.program_id(0), pl.program_id(2), pl.program_id(3)
  row = b * nq + qi

  @pl.when(step == 0)
  def _init():
    dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

  @pl.when(step < count_ref[row])
  def _visible_block():
    kj = kv_list_ref[row * nq + step]
    mask_QK = _mask(q_seg_ref[...], qi * block, k_seg_ref[...], k_end_ref[...], kj * block)
    s_QK = jax.lax.dot_general(q_ref[...], k_ref[...], _NT, preferred_element_type=jnp.float32) * scale
    p_QK = jnp.where(mask_QK, jnp.exp(s_QK - lse_ref[...]), 0.0)
    dp_QK = jax.lax.dot_general(do_ref[...], v_ref[...], _NT, preferred_element_type=jnp.float32)
    ds_QK = p_QK * (dp_QK - delta_ref[...])
    dq_scr[...] += jnp.dot(ds_QK.astype(k_ref.dtype), k_ref[...], preferred_element_type=jnp.float32)

  @pl.when(step == pl.num_programs(3) - 1)
  def _finish():
    dq_ref[...] = (dq_scr[...] * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_list_ref, count_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, q_seg_ref,
                k_seg_ref, k_end_ref, dk_ref, dv_ref, dk_scr, dv_scr, *, block: int, nq: int, scale: float):
  b, kj, g, step = pl.program_id(0), pl.program_id(2), pl.program_id(3), pl.program_id(4)
  row = b * nq + kj

  @pl.when((g == 0) & (step == 0))
  def _init():
    dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
    dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

  @pl.when(step < count_ref[row])
  def _visible_block():
    qi = q_list_ref[row * nq + step]
    mask_QK = _mask(q_seg_ref[...], qi * block, k_seg_ref[...], k_end_ref[...], kj * block)
    s_QK = jax.lax.dot_general(q_ref[...], k_ref[...], _NT, preferred_element_type=jnp.float32) * scale
    p_QK = jnp.where(mask_QK, jnp.exp(s_QK - lse_ref[...]), 0.0)
    do_QH = do_ref[...]
    dv_scr[...] += jax.lax.dot_general(p_QK.astype(do_QH.dtype), do_QH, _TN, preferred_element_type=jnp.float32)
    dp_QK = jax.lax.dot_general(do_QH, v_ref[...], _NT, preferred_element_type=jnp.float32)
    ds_QK = p_QK * (dp_QK - delta_ref[...])
    dk_scr[...] += jax.lax.dot_general(ds_QK.astype(q_ref.dtype), q_ref[...], _TN,
                                       preferred_element_type=jnp.float32)

  @pl.when((g == pl.num_programs(3) - 1) & (step == pl.num_programs(4) - 1))
  def _finish():
    dk_ref[...] = (dk_scr[...] * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


class _Layout:
  """Kernel-side arrays of one call: heads-major q/k/v [B, heads, T, H] (T padded to the block), the
  segment ids as a column [B, T, 1] (queries) and as rows [B, 1, T] (keys), and the compacted lists."""

  def __init__(self, segment_ids_BT: jax.Array, subtree_end_BT: jax.Array, block: int):
    self.block = block
    self.b, self.t = segment_ids_BT.shape
    self.nq = self.t // block
    table_Bqk = block_table(segment_ids_BT, subtree_end_BT, block)
    kv_list_Bqk, kv_count_Bq = compact(table_Bqk)
    q_list_Bkq, q_count_Bk = compact(table_Bqk.swapaxes(1, 2))
    # Flat 1-D prefetch arrays: SMEM pads the minor dimension of 2-D arrays.
    self.kv_list, self.kv_count = kv_list_Bqk.reshape(-1), kv_count_Bq.reshape(-1)
    self.q_list, self.q_count = q_list_Bkq.reshape(-1), q_count_Bk.reshape(-1)
    self.q_seg_BT1 = segment_ids_BT[:, :, None]
    self.k_seg_B1T = segment_ids_BT[:, None, :]
    self.k_end_B1T = subtree_end_BT[:, None, :]


def _seg_specs(block: int, q_block, k_block) -> list[pl.BlockSpec]:
  """Block specs of (q segment column, k segment row, k subtree-end row); q_block / k_block map the grid
  indices (and prefetch refs) to the query / key block index."""
  return [pl.BlockSpec((None, block, 1), lambda *a: (a[0], q_block(*a), 0)),
          pl.BlockSpec((None, 1, block), lambda *a: (a[0], 0, k_block(*a))),
          pl.BlockSpec((None, 1, block), lambda *a: (a[0], 0, k_block(*a)))]


def _call(kernel, grid, in_specs, out_specs, out_shape, scratch, semantics, interpret: bool):
  return pl.pallas_call(
      kernel, out_shape=out_shape, interpret=interpret,
      grid_spec=pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, grid=grid, in_specs=in_specs,
                                             out_specs=out_specs, scratch_shapes=scratch),
      compiler_params=pltpu.CompilerParams(dimension_semantics=semantics))


def _forward(lay: _Layout, q_BNTH, k_BKTH, v_BKTH, interpret: bool):
  b, n, t, h = q_BNTH.shape
  groups = n // k_BKTH.shape[1]
  blk, nq = lay.block, lay.nq
  kv_block = lambda bi, ni, qi, s, kv_list, count: kv_list[(bi * nq + qi) * nq + s]
  q_block = lambda bi, ni, qi, s, kv_list, count: qi
  q_spec = pl.BlockSpec((None, None, blk, h), lambda bi, ni, qi, s, *_: (bi, ni, qi, 0))
  kv_spec = pl.BlockSpec((None, None, blk, h), lambda bi, ni, qi, s, kv_list, count:
                         (bi, ni // groups, kv_list[(bi * nq + qi) * nq + s], 0))
  stat_spec = pl.BlockSpec((None, None, blk, 1), lambda bi, ni, qi, s, *_: (bi, ni, qi, 0))
  kernel = functools.partial(_forward_kernel, block=blk, nq=nq, scale=h ** -0.5)
  o_BNTH, lse_BNT1 = _call(
      kernel, (b, n, nq, nq), [q_spec, kv_spec, kv_spec] + _seg_specs(blk, q_block, kv_block),
      [q_spec, stat_spec],
      [jax.ShapeDtypeStruct(q_BNTH.shape, q_BNTH.dtype), jax.ShapeDtypeStruct((b, n, t, 1), jnp.float32)],
      [pltpu.VMEM((blk, 1), jnp.float32), pltpu.VMEM((blk, 1), jnp.float32), pltpu.VMEM((blk, h), jnp.float32)],
      ("parallel", "parallel", "parallel", "arbitrary"), interpret,
  )(lay.kv_list, lay.kv_count, q_BNTH, k_BKTH, v_BKTH, lay.q_seg_BT1, lay.k_seg_B1T, lay.k_end_B1T)
  return o_BNTH, lse_BNT1


def _backward(lay: _Layout, q_BNTH, k_BKTH, v_BKTH, o_BNTH, lse_BNT1, do_BNTH, interpret: bool):
  b, n, t, h = q_BNTH.shape
  kv = k_BKTH.shape[1]
  groups = n // kv
  blk, nq = lay.block, lay.nq
  kernel_args = dict(block=blk, nq=nq, scale=h ** -0.5)
  # delta_i = sum_h dO_ih O_ih = sum_j P_ij dP_ij: the softmax's backward correction per query.
  delta_BNT1 = jnp.sum(do_BNTH.astype(jnp.float32) * o_BNTH.astype(jnp.float32), axis=-1, keepdims=True)
  operands = (q_BNTH, k_BKTH, v_BKTH, do_BNTH, lse_BNT1, delta_BNT1, lay.q_seg_BT1, lay.k_seg_B1T, lay.k_end_B1T)

  # dQ: grid (row, query head, query block, step over its visible key blocks), as the forward pass.
  kv_block = lambda bi, ni, qi, s, kv_list, count: kv_list[(bi * nq + qi) * nq + s]
  q_rows = lambda bi, ni, qi, s, *_: (bi, ni, qi, 0)
  q_spec = pl.BlockSpec((None, None, blk, h), q_rows)
  kv_spec = pl.BlockSpec((None, None, blk, h), lambda bi, ni, qi, s, kv_list, count:
                         (bi, ni // groups, kv_block(bi, ni, qi, s, kv_list, count), 0))
  stat_spec = pl.BlockSpec((None, None, blk, 1), q_rows)
  dq_BNTH = _call(
      functools.partial(_dq_kernel, **kernel_args), (b, n, nq, nq),
      [q_spec, kv_spec, kv_spec, q_spec, stat_spec, stat_spec]
      + _seg_specs(blk, lambda bi, ni, qi, *_: qi, kv_block),
      q_spec, jax.ShapeDtypeStruct(q_BNTH.shape, q_BNTH.dtype), [pltpu.VMEM((blk, h), jnp.float32)],
      ("parallel", "parallel", "parallel", "arbitrary"), interpret,
  )(lay.kv_list, lay.kv_count, *operands)

  # dK, dV: grid (row, KV head, key block, query head of the group, step over visible query blocks);
  # the group's query heads accumulate into one KV head's gradient.
  q_block = lambda bi, ki, kj, g, s, q_list, count: q_list[(bi * nq + kj) * nq + s]
  q_rows_t = lambda bi, ki, kj, g, s, q_list, count: (bi, ki * groups + g, q_block(bi, ki, kj, g, s, q_list, count), 0)
  qt_spec = pl.BlockSpec((None, None, blk, h), q_rows_t)
  k_spec = pl.BlockSpec((None, None, blk, h), lambda bi, ki, kj, g, s, *_: (bi, ki, kj, 0))
  stat_t_spec = pl.BlockSpec((None, None, blk, 1), q_rows_t)
  dk_BKTH, dv_BKTH = _call(
      functools.partial(_dkv_kernel, **kernel_args), (b, kv, nq, groups, nq),
      [qt_spec, k_spec, k_spec, qt_spec, stat_t_spec, stat_t_spec]
      + _seg_specs(blk, q_block, lambda bi, ki, kj, *_: kj),
      [k_spec, k_spec],
      [jax.ShapeDtypeStruct(k_BKTH.shape, k_BKTH.dtype), jax.ShapeDtypeStruct(v_BKTH.shape, v_BKTH.dtype)],
      [pltpu.VMEM((blk, h), jnp.float32), pltpu.VMEM((blk, h), jnp.float32)],
      ("parallel", "parallel", "parallel", "arbitrary", "arbitrary"), interpret,
  )(lay.q_list, lay.q_count, *operands)
  return dq_BNTH, dk_BKTH, dv_BKTH


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attend(q_BNTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, block: int, interpret: bool):
  return _forward(_Layout(segment_ids_BT, subtree_end_BT, block), q_BNTH, k_BKTH, v_BKTH, interpret)[0]


def _attend_fwd(q_BNTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, block, interpret):
  o_BNTH, lse_BNT1 = _forward(_Layout(segment_ids_BT, subtree_end_BT, block), q_BNTH, k_BKTH, v_BKTH, interpret)
  return o_BNTH, (q_BNTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, o_BNTH, lse_BNT1)


def _attend_bwd(block, interpret, residuals, do_BNTH):
  q_BNTH, k_BKTH, v_BKTH, segment_ids_BT, subtree_end_BT, o_BNTH, lse_BNT1 = residuals
  lay = _Layout(segment_ids_BT, subtree_end_BT, block)
  dq, dk, dv = _backward(lay, q_BNTH, k_BKTH, v_BKTH, o_BNTH, lse_BNT1, do_BNTH, interpret)
  return dq, dk, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def pallas_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int = 512,
                     interpret: bool | None = None) -> jax.Array:
  """The kernel contract of `attention.dense_attention`. `block`: query and key block (a multiple of 128
  on TPU; small blocks are fine in interpret mode). `interpret`: None runs Mosaic when lowered for TPU
  and the interpreter elsewhere; True / False force one."""
  b, t, n, h = q_BTNH.shape
  pad = -t % block
  if pad:  # padded positions get segment 0: invisible, and their outputs are sliced off
    widths = ((0, 0), (0, pad), (0, 0), (0, 0))
    q_BTNH, k_BTKH, v_BTKH = (jnp.pad(x, widths) for x in (q_BTNH, k_BTKH, v_BTKH))
    segment_ids_BT = jnp.pad(segment_ids_BT, ((0, 0), (0, pad)))
    subtree_end_BT = jnp.pad(subtree_end_BT, ((0, 0), (0, pad)))
  args = (q_BTNH.transpose(0, 2, 1, 3), k_BTKH.transpose(0, 2, 1, 3), v_BTKH.transpose(0, 2, 1, 3),
          segment_ids_BT.astype(jnp.int32), subtree_end_BT.astype(jnp.int32))
  if interpret is None:
    o_BNTH = jax.lax.platform_dependent(*args, tpu=lambda *a: _attend(*a, block, False),
                                        default=lambda *a: _attend(*a, block, True))
  else:
    o_BNTH = _attend(*args, block, interpret)
  return o_BNTH.transpose(0, 2, 1, 3)[:, :t]
