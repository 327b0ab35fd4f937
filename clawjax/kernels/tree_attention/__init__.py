"""Tree attention: GQA softmax attention over the tree-packed layout of clawjax/tree/batch.py, under the
mask rule of mask.py. The model calls `tree_attention`; `attention_impl` names the implementation:

  "dense"    reference.py: [B, N, T, T] scores on device; what the others are checked against.
  "blocked"  reference.py: online softmax over key blocks (online_softmax.py), invisible ones skipped.
  "pallas"   dispatch.py: the block-sparse Pallas kernel (block_sparse.py's layout) of the platform it is
             lowered for: Mosaic on TPU (mosaic_tpu.py), Triton on a CUDA GPU (triton_gpu.py), the
             Pallas interpreter elsewhere.

check.py holds the numerical check of a kernel against the dense reference that the tests, the device
check (scripts/device_check.py) and benchmarks/tree_attention_kernels.py run.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from clawjax.kernels.tree_attention.dispatch import pallas_attention
from clawjax.kernels.tree_attention.reference import blocked_attention, dense_attention

Kernel = Callable[..., jax.Array]
KERNELS: dict[str, Kernel] = {"dense": dense_attention, "blocked": blocked_attention, "pallas": pallas_attention}


def register_kernel(name: str, kernel: Kernel) -> None:
  """Adds an implementation (same signature as `dense_attention`) selectable by `attention_impl`."""
  KERNELS[name] = kernel


def tree_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, impl: str, block: int
                   ) -> jax.Array:
  """o [B, T, N, H] from q [B, T, N, H], k/v [B, T, K, H] (after RoPE) and the rows' segment ids and
  subtree ends [B, T], by the implementation named `impl`, tiled at `block` where it tiles."""
  if impl not in KERNELS:
    raise ValueError(f"tree attention: attention_impl={impl!r}: registered kernels are {sorted(KERNELS)}")
  return KERNELS[impl](q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, block=block)
