"""Tree attention on a CUDA GPU: the block-sparse flash-attention kernel through Pallas's Triton lowering
(dispatch.py picks it when lowering for CUDA).

Same contract and mask rule as `reference.dense_attention`, and the same lists of visible blocks as the
TPU kernel (block_sparse.py). Triton has no scalar prefetch, and a BlockSpec's index map cannot read an
array, so a program is given whole rows: its row's keys and values (one KV head), segment ids, subtree
ends and its block's list, and walks the list with a loop bounded by the list's count, loading each
visible key block at its offset; an invisible block is neither loaded nor computed.

Programs: forward and dQ, one per (query block, row, query head), walking the key blocks the query block
sees; dK/dV, one per (key block, row, KV head), walking the query blocks that see the key block, each for
the G query heads of the group (the tile's mask is built once for them, and dK/dV sum them in the kernel,
so no per-query-head copy of dK/dV is written). The probabilities are recomputed from the forward pass's
logsumexp: nothing of size [T, T]. Softmax in base 2 (exp2 of scores scaled by log2(e)): the logsumexp is
kept in that base, which is internal to this kernel.

Block: queries and keys tile alike at `block` (a power of two, >= 16: Triton's dot tiles). 64 is the
default (`GPU_BLOCK`): a 64-row tile is one Hopper warpgroup's wgmma M with 4 warps; the dK/dV program's
two f32 accumulators (block x head_dim, kept across its loop) stay at 128 registers a thread at head_dim
128; and a finer table skips more of a tree (a visible tile computes all of its pairs, masked or not).
128 is the usual flash-attention forward tile on Hopper; whether its fuller tiles beat the extra masked
work on tree rows is for a GPU to measure (`pallas_attention(gpu_block=128)`,
benchmarks/tree_attention_kernels.py `time_kernels`). Each program runs 4 warps (8 from block 128) and
2 pipeline stages.

JAX versions: the calls used here lower alike under JAX 0.10 and 0.11 (0.11 warns that Pallas's Triton
backend is deprecated in favour of Mosaic GPU). Lowering for a GPU that is not attached (a compile from a
CPU host) needs the target as JAX's default device under 0.11: `aot.topology.lowering_for`.

Numerics: inputs in their dtype, matmuls accumulate in f32 (f32 inputs multiply in IEEE f32, not TF32),
softmax statistics and accumulators in f32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from clawjax.kernels.tree_attention.block_sparse import VisibleLists, pad_to_block, visible_lists
from clawjax.kernels.tree_attention.mask import visible as mask_rule
from clawjax.kernels.tree_attention.online_softmax import NEG as _NEG

GPU_BLOCK = 64
_NT = (((1,), (1,)), ((), ()))  # a @ b.T
_TN = (((0,), (0,)), ((), ()))  # a.T @ b
_LOG2E = math.log2(math.e)


def _dot(a, b, dims=(((1,), (0,)), ((), ()))) -> jax.Array:
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _block(ref, index, block: int):
  """Rows [index * block, (index + 1) * block) of a whole-row ref (the leading axis)."""
  return ref[pl.ds(pl.multiple_of(index * block, block), block)]


def _mask(seg_ref, end_ref, qi, kj, block: int) -> jax.Array:
  """[Q, K] bool: the mask rule on the tile of query block qi and key block kj of the program's row."""
  offsets = jnp.arange(block, dtype=jnp.int32)
  return mask_rule(_block(seg_ref, qi, block)[:, None], (qi * block + offsets)[:, None],
                   _block(seg_ref, kj, block)[None, :], (kj * block + offsets)[None, :],
                   _block(end_ref, kj, block)[None, :])


def _probs_and_dscores(q_QH, k_KH, v_KH, do_QH, lse_Q, delta_Q, mask_QK, scale: float):
  """Recomputed probabilities P and the scores' gradient dS = P * (dO V^T - delta) of one tile (f32)."""
  s_QK = _dot(q_QH, k_KH, _NT) * (scale * _LOG2E)
  p_QK = jnp.where(mask_QK, jnp.exp2(s_QK - lse_Q[:, None]), 0.0)
  return p_QK, p_QK * (_dot(do_QH, v_KH, _NT) - delta_Q[:, None])


def _forward_kernel(q_ref, k_ref, v_ref, seg_ref, end_ref, list_ref, count_ref, o_ref, lse_ref, *,
                    block: int, scale: float):
  qi = pl.program_id(0)
  q_QH = q_ref[...]

  def visit(step, carry):
    m_Q, l_Q, acc_QH = carry
    kj = list_ref[step]
    mask_QK = _mask(seg_ref, end_ref, qi, kj, block)
    v_KH = _block(v_ref, kj, block)
    s_QK = jnp.where(mask_QK, _dot(q_QH, _block(k_ref, kj, block), _NT) * (scale * _LOG2E), _NEG)
    m_new_Q = jnp.maximum(m_Q, jnp.max(s_QK, axis=1))
    p_QK = jnp.where(mask_QK, jnp.exp2(s_QK - m_new_Q[:, None]), 0.0)
    correction_Q = jnp.exp2(m_Q - m_new_Q)
    acc_QH = acc_QH * correction_Q[:, None] + _dot(p_QK.astype(v_KH.dtype), v_KH)
    return m_new_Q, l_Q * correction_Q + jnp.sum(p_QK, axis=1), acc_QH

  init = (jnp.full((block,), _NEG, jnp.float32), jnp.zeros((block,), jnp.float32),
          jnp.zeros(q_QH.shape, jnp.float32))
  m_Q, l_Q, acc_QH = jax.lax.fori_loop(0, count_ref[qi], visit, init)
  seen_Q = l_Q > 0
  l_Q = jnp.where(seen_Q, l_Q, 1.0)
  o_ref[...] = (acc_QH / l_Q[:, None]).astype(o_ref.dtype)
  # Rows that saw nothing: any finite value; the backward pass masks them out anyway.
  lse_ref[...] = jnp.where(seen_Q, m_Q + jnp.log2(l_Q), 0.0)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, end_ref, list_ref, count_ref,
               dq_ref, *, block: int, scale: float):
  qi = pl.program_id(0)
  q_QH, do_QH, lse_Q, delta_Q = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

  def visit(step, dq_QH):
    kj = list_ref[step]
    k_KH = _block(k_ref, kj, block)
    _, ds_QK = _probs_and_dscores(q_QH, k_KH, _block(v_ref, kj, block), do_QH, lse_Q, delta_Q,
                                  _mask(seg_ref, end_ref, qi, kj, block), scale)
    return dq_QH + _dot(ds_QK.astype(k_KH.dtype), k_KH)

  dq_QH = jax.lax.fori_loop(0, count_ref[qi], visit, jnp.zeros(q_QH.shape, jnp.float32))
  dq_ref[...] = (dq_QH * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, end_ref, list_ref, count_ref,
                dk_ref, dv_ref, *, block: int, scale: float):
  kj = pl.program_id(0)
  k_KH, v_KH = k_ref[...], v_ref[...]

  def visit(step, carry):
    qi = list_ref[step]
    mask_QK = _mask(seg_ref, end_ref, qi, kj, block)
    queries = pl.ds(pl.multiple_of(qi * block, block), block)

    # The group's query heads share the tile's mask. A loop, not unrolled: each head's q and dO tiles
    # take shared memory, and a group of 4 at head_dim 128 unrolled would ask for more than an H200 has.
    def head(g, carry):
      dk_KH, dv_KH = carry
      q_QH, do_QH = q_ref[queries, g, :], do_ref[queries, g, :]
      p_QK, ds_QK = _probs_and_dscores(q_QH, k_KH, v_KH, do_QH, lse_ref[g, queries], delta_ref[g, queries],
                                       mask_QK, scale)
      return (dk_KH + _dot(ds_QK.astype(q_QH.dtype), q_QH, _TN),
              dv_KH + _dot(p_QK.astype(do_QH.dtype), do_QH, _TN))

    return jax.lax.fori_loop(0, q_ref.shape[1], head, carry)

  zeros = jnp.zeros(k_KH.shape, jnp.float32)
  dk_KH, dv_KH = jax.lax.fori_loop(0, count_ref[kj], visit, (zeros, zeros))
  dk_ref[...] = (dk_KH * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv_KH.astype(dv_ref.dtype)


def _call(kernel, grid, in_specs, out_specs, out_shape, *, block: int, interpret: bool, name: str):
  params = plgpu.CompilerParams(num_warps=4 if block <= 64 else 8, num_stages=2)
  return pl.pallas_call(kernel, grid=grid, in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
                        compiler_params=params, interpret=interpret, name=name)


def _row_specs(nq: int, t: int) -> list[pl.BlockSpec]:
  """Whole-row specs of segment ids and subtree ends [B, T], and of the program's list [B, nq, nq] and
  counts [B, nq] (grid axes: outer block, row, head)."""
  row = pl.BlockSpec((None, t), lambda o, b, _: (b, 0))
  return [row, row, pl.BlockSpec((None, None, nq), lambda o, b, _: (b, o, 0)),
          pl.BlockSpec((None, nq), lambda o, b, _: (b, 0))]


def _forward(lists: VisibleLists, q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, block: int, scale: float,
             interpret: bool):
  b, t, n, h = q_BTNH.shape
  groups, nq = n // k_BTKH.shape[2], t // block
  q_spec = pl.BlockSpec((None, block, None, h), lambda qi, bi, ni: (bi, qi, ni, 0))
  kv_spec = pl.BlockSpec((None, t, None, h), lambda qi, bi, ni: (bi, 0, ni // groups, 0))
  lse_spec = pl.BlockSpec((None, None, block), lambda qi, bi, ni: (bi, ni, qi))
  kernel = functools.partial(_forward_kernel, block=block, scale=scale)
  return _call(kernel, (nq, b, n), [q_spec, kv_spec, kv_spec] + _row_specs(nq, t), [q_spec, lse_spec],
               [jax.ShapeDtypeStruct(q_BTNH.shape, q_BTNH.dtype), jax.ShapeDtypeStruct((b, n, t), jnp.float32)],
               block=block, interpret=interpret, name="tree_attention_forward",
               )(q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, lists.kv_list_Bqk, lists.kv_count_Bq)


def _backward(lists: VisibleLists, q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, o_BTNH, lse_BNT, do_BTNH,
              block: int, scale: float, interpret: bool):
  b, t, n, h = q_BTNH.shape
  kv = k_BTKH.shape[2]
  groups, nq = n // kv, t // block
  kernel_args = dict(block=block, scale=scale)
  # delta_i = sum_h dO_ih O_ih = sum_j P_ij dP_ij: the softmax's backward correction per query.
  delta_BNT = jnp.einsum("btnh,btnh->bnt", do_BTNH.astype(jnp.float32), o_BTNH.astype(jnp.float32))

  # dQ: the forward pass's programs and lists.
  q_spec = pl.BlockSpec((None, block, None, h), lambda qi, bi, ni: (bi, qi, ni, 0))
  kv_spec = pl.BlockSpec((None, t, None, h), lambda qi, bi, ni: (bi, 0, ni // groups, 0))
  stat_spec = pl.BlockSpec((None, None, block), lambda qi, bi, ni: (bi, ni, qi))
  dq_BTNH = _call(
      functools.partial(_dq_kernel, **kernel_args), (nq, b, n),
      [q_spec, kv_spec, kv_spec, q_spec, stat_spec, stat_spec] + _row_specs(nq, t), q_spec,
      jax.ShapeDtypeStruct(q_BTNH.shape, q_BTNH.dtype), block=block, interpret=interpret,
      name="tree_attention_dq",
  )(q_BTNH, k_BTKH, v_BTKH, do_BTNH, lse_BNT, delta_BNT, seg_BT, end_BT, lists.kv_list_Bqk, lists.kv_count_Bq)

  # dK, dV: per KV head, over the query blocks that see each key block; the group's query heads whole.
  group = lambda x_BTNH: x_BTNH.reshape(b, t, kv, groups, h)
  stats = lambda x_BNT: x_BNT.reshape(b, kv, groups, t)
  qg_spec = pl.BlockSpec((None, t, None, groups, h), lambda kj, bi, ki: (bi, 0, ki, 0, 0))
  k_spec = pl.BlockSpec((None, block, None, h), lambda kj, bi, ki: (bi, kj, ki, 0))
  stat_g_spec = pl.BlockSpec((None, None, groups, t), lambda kj, bi, ki: (bi, ki, 0, 0))
  dk_BTKH, dv_BTKH = _call(
      functools.partial(_dkv_kernel, **kernel_args), (nq, b, kv),
      [qg_spec, k_spec, k_spec, qg_spec, stat_g_spec, stat_g_spec] + _row_specs(nq, t), [k_spec, k_spec],
      [jax.ShapeDtypeStruct(k_BTKH.shape, k_BTKH.dtype), jax.ShapeDtypeStruct(v_BTKH.shape, v_BTKH.dtype)],
      block=block, interpret=interpret, name="tree_attention_dkv",
  )(group(q_BTNH), k_BTKH, v_BTKH, group(do_BTNH), stats(lse_BNT), stats(delta_BNT), seg_BT, end_BT,
    lists.q_list_Bkq, lists.q_count_Bk)
  return dq_BTNH, dk_BTKH, dv_BTKH


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attend(q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, block: int, scale: float, interpret: bool):
  lists = visible_lists(seg_BT, end_BT, block)
  return _forward(lists, q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, block, scale, interpret)[0]


def _attend_fwd(q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, block, scale, interpret):
  lists = visible_lists(seg_BT, end_BT, block)
  o_BTNH, lse_BNT = _forward(lists, q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, block, scale, interpret)
  return o_BTNH, (q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, o_BTNH, lse_BNT)


def _attend_bwd(block, scale, interpret, residuals, do_BTNH):
  q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, o_BTNH, lse_BNT = residuals
  lists = visible_lists(seg_BT, end_BT, block)
  dq, dk, dv = _backward(lists, q_BTNH, k_BTKH, v_BTKH, seg_BT, end_BT, o_BTNH, lse_BNT, do_BTNH, block,
                         scale, interpret)
  return dq, dk, dv, None, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def tile(block: int, cap: int = GPU_BLOCK) -> int:
  """The GPU tile for a config's `block`: min(block, cap) rounded down to a power of two, at least 16."""
  return max(16, 1 << (min(block, cap).bit_length() - 1))


def gpu_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int = GPU_BLOCK,
                  interpret: bool = False) -> jax.Array:
  """The kernel contract of `reference.dense_attention`. `block`: query and key block, a power of two
  >= 16 (`tile`). `interpret`: Pallas interpret mode (any backend) instead of Triton (CUDA only). A head
  dimension other than a power of two >= 16 is zero-padded to one (Triton's tiles again)."""
  if tile(block, block) != block:
    raise ValueError(f"GPU tree attention: block={block} must be a power of two >= 16 (Triton dot tiles)")
  t, h = q_BTNH.shape[1], q_BTNH.shape[3]
  q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT = pad_to_block(
      -t % block, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT)
  head_pad = ((0, 0), (0, 0), (0, 0), (0, max(16, 1 << (h - 1).bit_length()) - h))  # zeros add nothing to q.k
  q_BTNH, k_BTKH, v_BTKH = (jnp.pad(x, head_pad) for x in (q_BTNH, k_BTKH, v_BTKH))
  o_BTNH = _attend(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT.astype(jnp.int32), subtree_end_BT.astype(jnp.int32),
                   block, h ** -0.5, interpret)
  return o_BTNH[:, :t, :, :h]
