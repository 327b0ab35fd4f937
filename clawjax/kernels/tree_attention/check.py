"""The tree-attention kernel against the dense reference, on whatever device JAX runs on: what the tests
(in the Pallas interpreter on a CPU), scripts/device_check.py's `kernels` part (compiled, on the lent
accelerator) and benchmarks/tree_attention_kernels.py (`rel_error`) run.

  attention_errors(segment_ids, subtree_end)  `attention_impl="pallas"` (Mosaic on TPU, Triton on a GPU,
      the interpreter elsewhere: `dispatch.lowering` says which and why) against dense attention in
      float32 at the highest matmul precision, on the given rows: forward and dQ, dK, dV, for f32 and bf16
      inputs; max errors relative to the reference's largest entry, with the shapes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from clawjax.kernels.tree_attention.dispatch import lowering, pallas_attention, platform_of
from clawjax.kernels.tree_attention.reference import dense_attention


def rel_error(got: jax.Array, want: jax.Array) -> float:
  """max |got - want| / max |want|, computed in float32 where the arrays are (a long row's gradients stay
  on the device)."""
  got, want = jnp.asarray(got, jnp.float32), jnp.asarray(want, jnp.float32)
  return float(jnp.max(jnp.abs(got - want)) / jnp.maximum(jnp.max(jnp.abs(want)), 1e-30))


def attention_errors(segment_ids_BT, subtree_end_BT, *, block: int = 128, n_heads: int = 8, n_kv: int = 2,
                     head_dim: int = 128, seed: int = 0) -> dict[str, Any]:
  """The pallas kernel's errors against dense float32 attention on rows [B, T] of segment ids and subtree
  ends, with random q, k, v and output cotangent: {"float32": {"out", "dq", "dk", "dv"}, "bfloat16": ...}."""
  seg_BT, end_BT = jnp.asarray(segment_ids_BT, jnp.int32), jnp.asarray(subtree_end_BT, jnp.int32)
  b, t = seg_BT.shape
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (b, t, n_heads, head_dim))
  k, v = (jax.random.normal(key, (b, t, n_kv, head_dim)) for key in keys[1:3])
  do = jax.random.normal(keys[3], q.shape)

  def run(kernel, dtype):
    fn = jax.jit(lambda q, k, v: jax.vjp(lambda *a: kernel(*a, seg_BT, end_BT, block=block), q, k, v))
    out, vjp = fn(*(x.astype(dtype) for x in (q, k, v)))
    return (out, *vjp(do.astype(dtype)))

  with jax.default_matmul_precision("highest"):
    want = run(dense_attention, jnp.float32)
  lowered, why = lowering(platform_of(jax.devices()[0]))
  out: dict[str, Any] = {"rows": b, "row_len": t, "block": block, "heads": n_heads, "kv_heads": n_kv,
                         "head_dim": head_dim, "lowering": lowered, "why": why}
  for dtype in (jnp.float32, jnp.bfloat16):
    got = run(pallas_attention, dtype)
    out[jnp.dtype(dtype).name] = {name: rel_error(g, w) for name, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
  return out
