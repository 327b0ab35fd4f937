"""The accelerator kernels against their references, on whatever device JAX runs on: the numbers behind
scripts/device_check.py's `kernels` part (where the kernels run compiled, not interpreted).

  attention_errors()  `attention_impl="pallas"` (Mosaic on TPU, the GPU kernel on a GPU, the interpreter
                      elsewhere) against dense attention in float32 at the highest matmul precision, on the
                      rows of a packed GRPO group: forward and dQ, dK, dV, f32 and bf16 inputs.
  moe_errors()        the MoE block's grouped matmul kernel on this platform (Mosaic GPU on a GPU, megablox
                      on a TPU, megablox in the Pallas interpreter elsewhere) against float64 brute force
                      and `lax.ragged_dot` (clawjax/models/grouped_matmul_check.py).
Each returns max errors relative to the reference's largest entry, with the shapes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def _rel(got: jax.Array, want: jax.Array) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))


def _tree_rows(row_len: int) -> tuple[jax.Array, jax.Array]:
  """(segment ids, subtree ends) [1, T] of a packed GRPO group of two agent rollouts (prompt shared)."""
  from device_check import _group  # pylint: disable=import-outside-toplevel
  tree, _ = _group(row_len, 2, seed=row_len)
  return jnp.asarray(tree.segment_ids_RT, jnp.int32), jnp.asarray(tree.subtree_end_RT, jnp.int32)


def attention_errors(row_len: int = 1024, block: int = 128, n_heads: int = 8, n_kv: int = 2,
                     head_dim: int = 128) -> dict[str, Any]:
  from clawjax.models.attention import dense_attention  # pylint: disable=import-outside-toplevel
  from clawjax.kernels.tree_attention.dispatch import pallas_attention  # pylint: disable=import-outside-toplevel
  seg_BT, end_BT = _tree_rows(row_len)
  keys = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(keys[0], (1, row_len, n_heads, head_dim))
  k, v = (jax.random.normal(key, (1, row_len, n_kv, head_dim)) for key in keys[1:3])
  do = jax.random.normal(keys[3], q.shape)

  def run(kernel, dtype):
    fn = jax.jit(lambda q, k, v: jax.vjp(lambda *a: kernel(*a, seg_BT, end_BT, block=block), q, k, v))
    out, vjp = fn(*(x.astype(dtype) for x in (q, k, v)))
    return (out, *vjp(do.astype(dtype)))

  with jax.default_matmul_precision("highest"):
    want = run(dense_attention, jnp.float32)
  out: dict[str, Any] = {"row_len": row_len, "block": block, "heads": n_heads, "kv_heads": n_kv, "head_dim": head_dim}
  for dtype in (jnp.float32, jnp.bfloat16):
    got = run(pallas_attention, dtype)
    out[jnp.dtype(dtype).name] = {name: _rel(g, w) for name, g, w in zip(("out", "dq", "dk", "dv"), got, want)}
  return out


def moe_errors() -> dict[str, Any]:
  from clawjax.kernels.grouped_matmul.check import max_errors  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  kernel = {"gpu": "mosaic_gpu", "tpu": "megablox"}.get(device.platform, "megablox_interpret")
  return {"kernel": kernel, **max_errors(kernel, device)}
