"""Grouped matmuls, the MoE block's expert MLPs: the rows of x sorted by group (expert), each group's rows
times its own matrix, y[r] = x[r] @ w[g] for the rows r of group g. Groups are consecutive from row 0;
rows after the last group belong to none (pairs routed to another device's experts, padding).

`grouped_matmul` chooses the kernel per platform when lowered (`lax.platform_dependent`), so a step
compiled for a TPU slice or a GPU from a CPU host gets that target's kernel:
  tpu    megablox `gmm` (forward, input gradient) and `tgmm` (weight gradient): Pallas Mosaic kernels that
         visit only the row tiles holding a group. Their pallas_calls carry a cost estimate (2 m k n, m
         every row), so XLA's cost analysis counts their FLOPs.
  cuda   Mosaic GPU (Hopper wgmma) kernels under a custom VJP: `ragged_dot_mgpu` for the forward and, with
         the matrices transposed, the input gradient; `transposed_ragged_dot_mgpu` (contracting each
         group's rows) for the weight gradient. XLA's GPU compiler gives no FLOP count at all.
  other  `lax.ragged_dot` (XLA's own; CPU). On TPU XLA computes its weight gradient densely over every
         group (n_groups x the FLOPs), on GPU the forward and both gradients: 4.45 x the FLOPs of the
         Qwen3-30B-A3B step at 8K on TPU, 78 GiB of temporaries on GPU (BENCHMARKS.md).

Whatever a kernel leaves in the rows outside every group (its output there is undefined, also in the
input gradient), they are 0 here in y and in x's gradient, and x's values there reach neither y nor w's
gradient: they are zeroed before the kernel, since a kernel that masks by multiplying turns NaN into NaN.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu
from jax.experimental.pallas.ops.tpu import megablox

# TPU tiles: rows, contraction, output. A group that starts inside a row tile costs a second visit of that
# tile, so rows are tiled small (128: with 128 experts ~1/4 more MXU work at 512 rows an expert, not 2 x).
_TPU_ROWS = 128
_TPU_COLS = 512
# Hopper tiles (from the kernels' own search space): output rows and columns of a wgmma, and the
# contraction step, pipelined 4 deep: 4 x 32 KiB of shared memory in 16 bits and the 32 KiB output tile,
# of 227 KiB. Every dimension is padded to a multiple of 128.
_GPU_BLOCKS = dict(block_m=128, block_n=128, block_k=64, max_concurrent_steps=4, grid_block_n=1)
_GPU_MULTIPLE = 128
# Hopper's SMs (H100 and H200 SXM), for a kernel traced without a GPU (below).
_HOPPER_SMS = 132


def _pad(x: jax.Array, multiples: tuple[int, ...]) -> jax.Array:
  """x with zeros after each dim up to its multiple (unchanged where it already is one)."""
  widths = [(0, -d % m) for d, m in zip(x.shape, multiples)]
  return jnp.pad(x, widths) if any(w for _, w in widths) else x


def _tpu_tile(dim: int) -> int:
  """A column tile for `dim`: the whole dim when small, else the largest multiple of 128 up to
  _TPU_COLS that divides it (no partly masked last tile), else _TPU_COLS."""
  if dim <= _TPU_COLS:
    return dim
  return next((t for t in range(_TPU_COLS, 0, -128) if dim % t == 0), _TPU_COLS)


def _tpu_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
  """megablox's tiles for each of its calls (forward, and the gradients' calls with k and n swapped)."""
  del m
  return _TPU_ROWS, _tpu_tile(k), _tpu_tile(n)


def _megablox(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array, interpret: bool) -> jax.Array:
  m = x_MK.shape[0]
  # megablox's custom_vjp takes its static arguments positionally: preferred_element_type, tiling,
  # group_offset, existing_out, transpose_rhs, interpret.
  y_MN = megablox.gmm(_pad(x_MK, (_TPU_ROWS, 1)), w_GKN, group_sizes_G, x_MK.dtype, _tpu_tiling, None, None,
                      False, interpret)
  return y_MN[:m]


def _mgpu(lhs_MK: jax.Array, rhs_GKN: jax.Array, group_sizes_G: jax.Array, transpose_rhs: bool) -> jax.Array:
  """ragged_dot_mgpu on operands padded to its blocks (the result cut back): rhs [G, K, N], or [G, N, K]
  with `transpose_rhs`."""
  m = lhs_MK.shape[0]
  n = rhs_GKN.shape[1] if transpose_rhs else rhs_GKN.shape[2]
  y_MN = ragged_dot_mgpu.ragged_dot(_pad(lhs_MK, (_GPU_MULTIPLE,) * 2), _pad(rhs_GKN, (1,) + (_GPU_MULTIPLE,) * 2),
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
def _mosaic_gpu(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array) -> jax.Array:
  return _mgpu(x_MK, w_GKN, group_sizes_G, transpose_rhs=False)


def _mosaic_gpu_fwd(x_MK, w_GKN, group_sizes_G):
  return _mosaic_gpu(x_MK, w_GKN, group_sizes_G), (x_MK, w_GKN, group_sizes_G)


def _mosaic_gpu_bwd(residuals, dy_MN):
  x_MK, w_GKN, group_sizes_G = residuals
  _, k, n = w_GKN.shape
  dx_MK = _mgpu(dy_MN, w_GKN, group_sizes_G, transpose_rhs=True)
  with _sm_count_for_tracing():
    dw_GKN = transposed_ragged_dot_mgpu.transposed_ragged_dot(
        _pad(x_MK, (_GPU_MULTIPLE,) * 2), _pad(dy_MN, (_GPU_MULTIPLE,) * 2), group_sizes=group_sizes_G,
        **_GPU_BLOCKS)
  return dx_MK, dw_GKN[:, :k, :n], None


_mosaic_gpu.defvjp(_mosaic_gpu_fwd, _mosaic_gpu_bwd)


def _xla(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array) -> jax.Array:
  # Looked up at each call, not bound at import: tests substitute a ragged_dot whose rows outside the
  # groups are garbage.
  return jax.lax.ragged_dot(x_MK, w_GKN, group_sizes_G)


_BY_NAME: dict[str, Callable[..., jax.Array]] = {
    "megablox": functools.partial(_megablox, interpret=False),
    "megablox_interpret": functools.partial(_megablox, interpret=True),
    "mosaic_gpu": _mosaic_gpu,
    "xla": _xla,
}
KERNELS = tuple(_BY_NAME)


SCOPE = "grouped_matmul"


def takes(kernel: str, dtype: jnp.dtype) -> bool:
  """Whether `kernel` runs in `dtype`: Hopper's wgmma transposes only 16-bit operands, and both of the
  Mosaic GPU path's gradients need a transpose."""
  return kernel != "mosaic_gpu" or jnp.dtype(dtype).itemsize == 2


def grouped_matmul(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array, kernel: str | None = None
                   ) -> jax.Array:
  """y [M, N]: y[r] = x[r] @ w[g] for the rows r of group g (group g: the group_sizes[g] rows after the
  groups before it), 0 in the rows after the last group; differentiable in x and w. x and w of one dtype
  (bfloat16 or float32), y of that dtype. `kernel`: None chooses per platform (module docstring), or one
  of KERNELS ("megablox_interpret": the TPU kernels in Pallas interpret mode, on any platform)."""
  if kernel is not None and kernel not in _BY_NAME:
    raise ValueError(f"grouped_matmul: kernel {kernel!r} is not one of {KERNELS}")
  with jax.named_scope(SCOPE):  # clawjax/aot/lowering.py finds the kernel a compiled step got by it
    return _grouped_matmul(x_MK, w_GKN, group_sizes_G, kernel)


def _grouped_matmul(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array, kernel: str | None) -> jax.Array:
  valid_M1 = (jnp.arange(x_MK.shape[0]) < jnp.sum(group_sizes_G))[:, None]
  args = (jnp.where(valid_M1, x_MK, 0), w_GKN, group_sizes_G.astype(jnp.int32))
  if kernel is None:
    cuda = "mosaic_gpu" if takes("mosaic_gpu", x_MK.dtype) else "xla"
    y_MN = jax.lax.platform_dependent(*args, tpu=_BY_NAME["megablox"], cuda=_BY_NAME[cuda],
                                      default=_BY_NAME["xla"])
  else:
    y_MN = _BY_NAME[kernel](*args)
  return jnp.where(valid_M1, y_MN, 0)
