"""Grouped matmul on a Hopper GPU: Mosaic GPU (wgmma) kernels under a custom VJP, `ragged_dot_mgpu` for the
forward and, with the matrices transposed, the input gradient; `transposed_ragged_dot_mgpu` (contracting
each group's rows) for the weight gradient. XLA's GPU compiler gives no FLOP count for them."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import jax
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

from clawjax.kernels.grouped_matmul.padding import pad

# Hopper tiles (from the kernels' own search space): output rows and columns of a wgmma, and the
# contraction step, pipelined 4 deep: 4 x 32 KiB of shared memory in 16 bits and the 32 KiB output tile,
# of 227 KiB. Every dimension is padded to a multiple of 128.
_GPU_BLOCKS = dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=1)
_GPU_MULTIPLE = 128
# Hopper's SMs (H100 and H200 SXM), for a kernel traced without a GPU (below).
_HOPPER_SMS = 132


def _mgpu(lhs_MK: jax.Array, rhs_GKN: jax.Array, group_sizes_G: jax.Array, transpose_rhs: bool) -> jax.Array:
  """ragged_dot_mgpu on operands padded to its blocks (the result cut back): rhs [G, K, N], or [G, N, K]
  with `transpose_rhs`."""
  m = lhs_MK.shape[0]
  n = rhs_GKN.shape[1] if transpose_rhs else rhs_GKN.shape[2]
  y_MN = ragged_dot_mgpu.ragged_dot(pad(lhs_MK, (_GPU_MULTIPLE,) * 2), pad(rhs_GKN, (1,) + (_GPU_MULTIPLE,) * 2),
                                    group_sizes=group_sizes_G, transpose_rhs=transpose_rhs, **_GPU_BLOCKS)
  return y_MN[:m, :n]


@contextlib.contextmanager
def _sm_count_for_tracing() -> Iterator[None]:
  """transposed_ragged_dot_mgpu sizes its persistent grid by `jax.devices()[0].core_count`, the SMs of the
  default backend's first device. Compiled deviceless for a GPU from a CPU host (clawjax/aot) that device is
  the host's CPU, which has none: while the kernel traces, its module's `jax` answers `devices()` with a
  Hopper's count. Only the grid's size depends on it (the work is spread over however many blocks);
  ragged_dot_mgpu has the same count written in."""
  if hasattr(jax.devices()[0], "core_count"):
    yield
    return
  transposed_ragged_dot_mgpu.jax = _JaxOnHopper()
  try:
    yield
  finally:
    transposed_ragged_dot_mgpu.jax = jax


class _JaxOnHopper:
  """`jax`, but with one Hopper GPU as its devices."""

  def __getattr__(self, name: str):
    return getattr(jax, name)

  @staticmethod
  def devices() -> list[types.SimpleNamespace]:
    return [types.SimpleNamespace(core_count=_HOPPER_SMS)]


@jax.custom_vjp
def mosaic_gpu(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array) -> jax.Array:
  return _mgpu(x_MK, w_GKN, group_sizes_G, transpose_rhs=False)


def _mosaic_gpu_fwd(x_MK, w_GKN, group_sizes_G):
  return mosaic_gpu(x_MK, w_GKN, group_sizes_G), (x_MK, w_GKN, group_sizes_G)


def _mosaic_gpu_bwd(residuals, dy_MN):
  x_MK, w_GKN, group_sizes_G = residuals
  _, k, n = w_GKN.shape
  dx_MK = _mgpu(dy_MN, w_GKN, group_sizes_G, transpose_rhs=True)
  with _sm_count_for_tracing():
    dw_GKN = transposed_ragged_dot_mgpu.transposed_ragged_dot(
        pad(x_MK, (_GPU_MULTIPLE,) * 2), pad(dy_MN, (_GPU_MULTIPLE,) * 2), group_sizes=group_sizes_G,
        **_GPU_BLOCKS)
  return dx_MK, dw_GKN[:, :k, :n], None


mosaic_gpu.defvjp(_mosaic_gpu_fwd, _mosaic_gpu_bwd)
