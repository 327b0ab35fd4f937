"""Tree attention in the decoder: GQA self-attention over the tree-packed layout of clawjax/tree/batch.py,
with q/k RMSNorm (Qwen3) and RoPE at the tokens' tree depths.

The attention itself is one call, `clawjax.kernels.tree_attention.tree_attention`, by the implementation
that `ModelConfig.attention_impl` names ("dense", "blocked", "pallas"; the mask rule, the references and
the per-platform kernels live there). Under the learner's mesh it runs per shard (`shard_map` over the
rows' and heads' mesh axes): which key blocks to skip is each device's decision about its own rows, with
no collective per block, and a device holding only padding rows skips them all.

Engine hook: `Attention.project_qkv` / `Attention.project_out` expose the projections around the
attention, and `masked_attention` (queries and keys of different lengths: a KV cache) and
`online_softmax_*` (the per-key-block update of "blocked", which the engine's attention to long caches runs
too) are the kernels' own, reached through here.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd
from jax.sharding import PartitionSpec as P

from clawjax.kernels.tree_attention import KERNELS, Kernel, tree_attention
# The engine's hook (the engine reaches the kernels only through the model).
from clawjax.kernels.tree_attention.online_softmax import (  # pylint: disable=unused-import
    online_softmax_init, online_softmax_result, online_softmax_step)
from clawjax.kernels.tree_attention.reference import masked_attention  # pylint: disable=unused-import
from clawjax.models.config import ModelConfig
from clawjax.models.layers import RMSNorm, apply_rope, constrain, param
from clawjax.sharding import logical_to_mesh


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
    kernel = functools.partial(tree_attention, impl=self.cfg.attention_impl)
    o_BTNH = per_shard(kernel, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, block=self.cfg.attention_block)
    return self.project_out(constrain(o_BTNH, ("batch", "length", "heads", "head_dim")))
