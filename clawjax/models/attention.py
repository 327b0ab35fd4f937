"""Tree attention: GQA self-attention over the tree-packed layout of clawjax/tree/batch.py.

Mask rule: key j is visible to query i iff segment[i] == segment[j] != 0 and j <= i < subtree_end[j].
The mask is only ever formed on device from the [B, T] arrays, never as a host-side [T, T] array.

Kernels live in `KERNELS` (name -> function, chosen by `ModelConfig.attention_impl`):
  "dense":   reference; materialises [B, N, T, T] scores on device.
  "blocked": online softmax over key blocks (flash-attention style) with memory O(T * block) forward
             and, through rematerialisation, per query block in the backward pass; key blocks that no
             query of the block can see (after the queries, subtrees ended before them, other segments)
             are skipped with `lax.cond`.
  "pallas":  the same online softmax as a block-sparse Pallas kernel (clawjax/models/pallas_attention.py):
             per-row lists of visible (query block, key block) pairs, computed on device, so invisible
             blocks are neither loaded nor computed; forward and backward (custom VJP, recomputed from
             the saved logsumexp). Chosen when lowered: a Mosaic kernel on TPU, a Triton kernel on a
             CUDA GPU, Pallas interpret mode on other backends (slow: for tests).
Under the learner's mesh a kernel runs per shard (`shard_map` over the rows' and heads' mesh axes): which
key blocks to skip is each device's decision about its own rows, with no collective per block, and a
device holding only padding rows skips them all.

Engine hook: `Attention.project_qkv` / `Attention.project_out` expose the projections around the kernel,
and `tree_mask` / `masked_attention` take queries and keys of different lengths (a KV cache) with the
queries at explicit row indices; `online_softmax_*` is the per-key-block update of "blocked", which the
engine's attention to long caches runs too.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd
from jax.sharding import PartitionSpec as P

from clawjax.kernels.tree_attention.block_sparse import pad_to_block
from clawjax.models.config import ModelConfig
from clawjax.models.layers import RMSNorm, apply_rope, constrain, einsum_f32, param
from clawjax.kernels.tree_attention.dispatch import pallas_attention
from clawjax.sharding import logical_to_mesh

_NEG = -1e30  # finite "minus infinity": keeps fully masked rows free of NaN


def tree_mask(q_index_BT: jax.Array, q_segment_BT: jax.Array, k_segment_BS: jax.Array,
              k_subtree_end_BS: jax.Array, k_start: jax.Array | int = 0) -> jax.Array:
  """[B, T, S] bool: is key s (row index k_start + s) visible to the query at row index q_index[t]?"""
  k_index_11S = (k_start + jnp.arange(k_segment_BS.shape[1]))[None, None, :]
  q_index_BT1 = q_index_BT[:, :, None]
  same = (q_segment_BT[:, :, None] == k_segment_BS[:, None, :]) & (q_segment_BT[:, :, None] != 0)
  return same & (k_index_11S <= q_index_BT1) & (q_index_BT1 < k_subtree_end_BS[:, None, :])


def masked_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_BTS: jax.Array) -> jax.Array:
  """Softmax attention with GQA under an explicit mask; rows with no visible key give 0."""
  b, t, n, h = q_BTNH.shape
  kv = k_BSKH.shape[2]
  q_BTKGH = q_BTNH.reshape(b, t, kv, n // kv, h)
  scores_BKGTS = einsum_f32("btkgh,bskh->bkgts", q_BTKGH, k_BSKH) * h ** -0.5
  mask_B11TS = mask_BTS[:, None, None]
  probs_BKGTS = jnp.where(mask_B11TS, jax.nn.softmax(jnp.where(mask_B11TS, scores_BKGTS, _NEG), axis=-1), 0.0)
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
  q_lo = jnp.min(jnp.where(q_seg_BQ > 0, q_seg_BQ, big), axis=1)
  q_hi = jnp.max(q_seg_BQ, axis=1)
  k_lo = jnp.min(jnp.where(k_seg_BK > 0, k_seg_BK, big), axis=1)
  k_hi = jnp.max(k_seg_BK, axis=1)
  segments_overlap_B = (q_lo <= k_hi) & (k_lo <= q_hi)
  subtree_reaches_B = jnp.max(k_end_BK, axis=1) > q_start
  return (k_start < q_start + block) & jnp.any(segments_overlap_B & subtree_reaches_B)


OnlineSoftmax = tuple[jax.Array, jax.Array, jax.Array]  # running max, normaliser [B, K, G, Q]; accumulator [B, K, G, Q, H]


def online_softmax_init(shape_BKGQ: tuple[int, ...], head_dim: int) -> OnlineSoftmax:
  return (jnp.full(shape_BKGQ, _NEG, jnp.float32), jnp.zeros(shape_BKGQ, jnp.float32),
          jnp.zeros((*shape_BKGQ, head_dim), jnp.float32))


def online_softmax_step(carry: OnlineSoftmax, s_BKGQS: jax.Array, mask_B11QS: jax.Array,
                        v_BSKH: jax.Array) -> OnlineSoftmax:
  """One key block of a flash-attention softmax: float32 scores [B, K, G, Q, S] of the block's keys, which
  of them each query sees, and their values."""
  m_BKGQ, l_BKGQ, acc_BKGQH = carry
  s_BKGQS = jnp.where(mask_B11QS, s_BKGQS, _NEG)
  m_new = jnp.maximum(m_BKGQ, jnp.max(s_BKGQS, axis=-1))
  p_BKGQS = jnp.where(mask_B11QS, jnp.exp(s_BKGQS - m_new[..., None]), 0.0)
  correction = jnp.exp(m_BKGQ - m_new)
  pv_BKGQH = einsum_f32("bkgqs,bskh->bkgqh", p_BKGQS.astype(v_BSKH.dtype), v_BSKH)
  return m_new, l_BKGQ * correction + jnp.sum(p_BKGQS, axis=-1), acc_BKGQH * correction[..., None] + pv_BKGQH


def online_softmax_result(carry: OnlineSoftmax) -> jax.Array:
  """[B, K, G, Q, H] float32 attention outputs; 0 for a query that saw no key."""
  _, l_BKGQ, acc_BKGQH = carry
  return acc_BKGQH / jnp.where(l_BKGQ > 0, l_BKGQ, 1.0)[..., None]


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


Kernel = Callable[..., jax.Array]
KERNELS: dict[str, Kernel] = {"dense": dense_attention, "blocked": blocked_attention, "pallas": pallas_attention}


def register_kernel(name: str, kernel: Kernel) -> None:
  """Adds an attention kernel (same signature as `dense_attention`) selectable by `attention_impl`."""
  KERNELS[name] = kernel


def per_shard(kernel: Kernel, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int) -> jax.Array:
  """`kernel` on each device's rows and heads when tracing under a mesh with logical axis rules (as the
  learner's steps do); the kernel itself elsewhere. Heads stay whole on a device unless the query and
  key/value heads split alike (GQA groups must not straddle devices)."""
  rules, mesh = spmd.get_logical_axis_rules(), jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return kernel(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, block=block)
  q_spec = logical_to_mesh(("batch", "length", "heads", "head_dim"), q_BTNH.shape, mesh, rules)
  kv_spec = logical_to_mesh(("batch", "length", "kv_heads", "head_dim"), k_BTKH.shape, mesh, rules)
  if q_spec[2] != kv_spec[2]:
    q_spec, kv_spec = P(q_spec[0], None, None, None), P(kv_spec[0], None, None, None)
  rows_spec = P(q_spec[0], None)
  fn = lambda *args: kernel(*args, block=block)
  # check_vma off: a skipped block's branch returns the carry as it came, which the varying-axes type
  # check cannot tell apart from the computed branch.
  return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, rows_spec, rows_spec),
                       out_specs=q_spec, check_vma=False)(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT)


class Attention(nnx.Module):
  """GQA self-attention with optional q/k RMSNorm (Qwen3) and RoPE at `positions` (tree depth).

  Engine API (stable): `project_qkv(x_BTD, positions_BT) -> (q_BTNH, k_BTKH, v_BTKH)` after q/k-norm and
  RoPE (`position_qkv`, for an engine that projects with weights of its own layout); `project_out(o_BTNH)
  -> y_BTD`. A KV-cache engine stores k/v, attends with `masked_attention`, and projects out.
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    if cfg.attention_impl not in KERNELS:
      raise ValueError(f"ModelConfig.attention_impl={cfg.attention_impl!r}: registered kernels are {sorted(KERNELS)}")
    self.cfg = cfg
    d, n, kv, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    self.q_proj = param(rngs, (d, n, h), ("embed", "heads", "head_dim"), cfg.param_dtype)
    self.k_proj = param(rngs, (d, kv, h), ("embed", "kv_heads", "head_dim"), cfg.param_dtype)
    self.v_proj = param(rngs, (d, kv, h), ("embed", "kv_heads", "head_dim"), cfg.param_dtype)
    self.o_proj = param(rngs, (n, h, d), ("heads", "head_dim", "embed"), cfg.param_dtype, fan_in=n * h)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.rms_eps, cfg.param_dtype, ("head_dim",), rngs=rngs)
      self.k_norm = RMSNorm(h, cfg.rms_eps, cfg.param_dtype, ("head_dim",), rngs=rngs)

  def project_qkv(self, x_BTD: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    cfg = self.cfg
    x_BTD = x_BTD.astype(cfg.dtype)
    q_BTNH = jnp.einsum("btd,dnh->btnh", x_BTD, self.q_proj[...].astype(cfg.dtype))
    k_BTKH = jnp.einsum("btd,dkh->btkh", x_BTD, self.k_proj[...].astype(cfg.dtype))
    v_BTKH = jnp.einsum("btd,dkh->btkh", x_BTD, self.v_proj[...].astype(cfg.dtype))
    return self.position_qkv(q_BTNH, k_BTKH, v_BTKH, positions_BT)

  def position_qkv(self, q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, positions_BT: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The projected q, k, v as `project_qkv` returns them: q/k-norm, then RoPE."""
    cfg = self.cfg
    if cfg.qk_norm:
      q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
    q_BTNH = constrain(apply_rope(q_BTNH, positions_BT, cfg.rope_theta), ("batch", "length", "heads", "head_dim"))
    k_BTKH = constrain(apply_rope(k_BTKH, positions_BT, cfg.rope_theta), ("batch", "length", "kv_heads", "head_dim"))
    return q_BTNH, k_BTKH, constrain(v_BTKH, ("batch", "length", "kv_heads", "head_dim"))

  def project_out(self, o_BTNH: jax.Array) -> jax.Array:
    return jnp.einsum("btnh,nhd->btd", o_BTNH.astype(self.cfg.dtype), self.o_proj[...].astype(self.cfg.dtype))

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
               subtree_end_BT: jax.Array) -> jax.Array:
    q_BTNH, k_BTKH, v_BTKH = self.project_qkv(x_BTD, positions_BT)
    kernel = KERNELS[self.cfg.attention_impl]
    o_BTNH = per_shard(kernel, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, block=self.cfg.attention_block)
    return self.project_out(constrain(o_BTNH, ("batch", "length", "heads", "head_dim")))
