"""Tree attention as a block-sparse Pallas flash-attention kernel (`attention_impl="pallas"`): the one
place that chooses the kernel per platform.

Same contract and mask rule as `reference.dense_attention`: q [B, T, N, H], k/v [B, T, K, H] (GQA),
segment ids and subtree ends [B, T] (mask.py). Rows with no visible key give 0. Both kernels read the
layout of block_sparse.py (per-row lists of visible key blocks, computed on device): an invisible block
is neither loaded nor computed, forward or backward (dQ and dK/dV recomputed from the saved logsumexp).

What runs where is chosen when the program is lowered (`lax.platform_dependent`), so a config runs
unchanged on any backend, and a jit compiled for a TPU slice or a GPU node from a CPU host gets that
accelerator's kernel (`LOWERINGS` says which and why):
  TPU:       the Mosaic kernel (mosaic_tpu.py) at `block`.
  CUDA GPU:  the Triton kernel (triton_gpu.py) at min(block, gpu_block) rounded down to a power of two
             (at least 16): Triton tiles are far smaller than a TPU's (the default `block` 512 is 64 on
             a GPU).
  elsewhere: the Mosaic kernel in Pallas interpret mode (correct, slow: for tests on a CPU).
"""

from __future__ import annotations

import functools

import jax

from clawjax.kernels.tree_attention.triton_gpu import GPU_BLOCK, gpu_attention, tile
from clawjax.kernels.tree_attention.mosaic_tpu import tpu_attention

# The name scope of every op of the kernel (and of its layout): how a compiled program's HLO tells which
# lowering the attention got (clawjax/aot/lowering.py).
SCOPE = "tree_attention"

# platform (as `lax.platform_dependent` names it; "default": any other) -> (what runs, why).
LOWERINGS = {
    "tpu": ("mosaic_tpu", "the Mosaic kernel: TPU blocks at `block` (a multiple of 128), lists in SMEM"),
    "cuda": ("triton", "the Triton kernel at `kernel_block`: a GPU's tiles are far smaller than a TPU's"),
    "default": ("interpret", "no Pallas compiler for this backend: the Mosaic kernel in the Pallas "
                "interpreter (correct, slow: for tests)"),
}


def platform_of(device: jax.Device) -> str:
  """The device's platform as `lax.platform_dependent` names it ("cuda" for a GPU)."""
  return "cuda" if device.platform == "gpu" else device.platform


def lowering(platform: str) -> tuple[str, str]:
  """(what `pallas_attention` runs as on `platform`, why): "mosaic_tpu", "triton" or "interpret"."""
  return LOWERINGS.get(platform, LOWERINGS["default"])


def kernel_block(block: int, platform: str, gpu_block: int = GPU_BLOCK) -> int:
  """The block the kernel tiles at when lowered for `platform` (as `lax.platform_dependent` names it:
  "tpu", "cuda", "cpu", ...)."""
  return tile(block, gpu_block) if platform == "cuda" else block


def pallas_attention(q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT, *, block: int = 512,
                     gpu_block: int = GPU_BLOCK) -> jax.Array:
  """The kernel contract of `reference.dense_attention`. `block`: query and key block (a multiple of 128
  on TPU); `gpu_block`: the most a GPU tile may be (a power of two >= 16)."""
  tpu = functools.partial(tpu_attention, block=block)
  with jax.named_scope(SCOPE):
    return jax.lax.platform_dependent(
        q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT,
        tpu=functools.partial(tpu, interpret=False),
        cuda=functools.partial(gpu_attention, block=kernel_block(block, "cuda", gpu_block)),
        default=functools.partial(tpu, interpret=True))
