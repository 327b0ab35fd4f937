"""Grouped matmul on TPU: megablox `gmm` (forward, input gradient) and `tgmm` (weight gradient), Pallas
Mosaic kernels that visit only the row tiles holding a group. Their pallas_calls carry a cost estimate
(2 m k n, m every row), so XLA's cost analysis counts their FLOPs. `interpret`: the same kernels in the
Pallas interpreter, on any platform (the CPU tests)."""

from __future__ import annotations

import jax
from jax.experimental.pallas.ops.tpu import megablox

from clawjax.kernels.grouped_matmul.padding import pad

# TPU tiles: rows, contraction, output. A group that starts inside a row tile costs a second visit of that
# tile, so rows are tiled small (128: with 128 experts ~1/4 more MXU work at 512 rows an expert, not 2 x).
_TPU_ROWS = 128
_TPU_COLS = 512


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


def gmm(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array, interpret: bool) -> jax.Array:
  m = x_MK.shape[0]
  # megablox's custom_vjp takes its static arguments positionally: preferred_element_type, tiling,
  # group_offset, existing_out, transpose_rhs, interpret.
  y_MN = megablox.gmm(pad(x_MK, (_TPU_ROWS, 1)), w_GKN, group_sizes_G, x_MK.dtype, _tpu_tiling, None, None,
                      False, interpret)
  return y_MN[:m]
