"""A grouped-matmul kernel (dispatch.py) against float64 brute force, a loop over the groups in NumPy, and
against `lax.ragged_dot` (reference.py) run on the same device: the output and both gradients, on small
shapes that reach every edge: empty groups, groups that start and end inside a tile, rows outside every
group (NaN in x there, which must reach nothing), dimensions that are no multiple of a tile.

`device_errors()`: the kernel of JAX's default device (what scripts/device_check.py's `kernels` part
runs); `max_errors(kernel, device)` any one, e.g. `max_errors("mosaic_gpu", jax.devices("gpu")[0])`. On CPU
the tests run the TPU kernels in interpret mode through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.kernels.grouped_matmul.dispatch import grouped_matmul, takes


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  rows: int
  k: int
  n: int
  group_sizes: tuple[int, ...]
  dtype: str


CASES = (
    # 44 rows after the groups; groups of 0, 1 and 37 rows; k and n multiples of 128.
    Case("ragged_bf16", 300, 256, 384, (0, 37, 128, 0, 1, 90), "bfloat16"),
    # Every row in a group; k and n no multiple of 64 or 128; the first group empty, the last one long.
    Case("odd_dims_bf16", 200, 96, 160, (0, 64, 0, 100, 36), "bfloat16"),
    Case("ragged_f32", 300, 256, 384, (0, 37, 128, 0, 1, 90), "float32"),
)


def brute_force(x_MK: np.ndarray, w_GKN: np.ndarray, group_sizes: tuple[int, ...], dy_MN: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(y, dx, dw) in float64 for the loss sum(y * dy); rows outside every group are 0 in y and dx."""
  x, w, dy = (np.asarray(a, np.float64) for a in (x_MK, w_GKN, dy_MN))
  y, dx, dw = np.zeros((x.shape[0], w.shape[2])), np.zeros_like(x), np.zeros_like(w)
  start = 0
  for g, size in enumerate(group_sizes):
    rows = slice(start, start + size)
    y[rows] = x[rows] @ w[g]
    dx[rows] = dy[rows] @ w[g].T
    dw[g] = x[rows].T @ dy[rows]
    start += size
  return y, dx, dw


def _inputs(case: Case, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """x (NaN after the groups), w and the cotangent dy, as float32 values the case's dtype holds exactly."""
  rng = np.random.default_rng(seed)
  exact = lambda a: np.array(jnp.asarray(a, case.dtype).astype(jnp.float32))
  x = exact(rng.standard_normal((case.rows, case.k)))
  x[sum(case.group_sizes):] = np.nan
  w = exact(rng.standard_normal((len(case.group_sizes), case.k, case.n)) / np.sqrt(case.k))
  dy = exact(rng.standard_normal((case.rows, case.n)))
  return x, w, dy


def _run(kernel: str, case: Case, x, w, dy, device: jax.Device | None) -> tuple[np.ndarray, ...]:
  def f(x_MK, w_GKN, dy_MN):
    y_MN, vjp = jax.vjp(lambda x, w: grouped_matmul(x, w, jnp.asarray(case.group_sizes, jnp.int32), kernel),
                        x_MK, w_GKN)
    return (y_MN, *vjp(dy_MN))

  args = [jax.device_put(jnp.asarray(a, case.dtype), device) for a in (x, w, dy)]
  return tuple(np.asarray(a.astype(jnp.float32), np.float64) for a in jax.jit(f)(*args))


def max_errors(kernel: str, device: jax.Device | None = None, seed: int = 0) -> dict[str, dict[str, float]]:
  """For each case in a dtype `kernel` takes: the largest error of y, dx and dw, relative to the largest
  magnitude of the float64 value, of `kernel` ("kernel_y", ...) and of `lax.ragged_dot` on the same device
  ("ragged_dot_y", ..., the dtype's own rounding), and the largest gap between the two ("gap_y", ...).
  NaN where a NaN leaked."""
  out = {}
  for case in (c for c in CASES if takes(kernel, c.dtype)):
    x, w, dy = _inputs(case, seed)
    exact = brute_force(np.nan_to_num(x), w, case.group_sizes, dy)
    got = _run(kernel, case, x, w, dy, device)
    ref = _run("xla", case, x, w, dy, device)
    errors = {}
    for name, e, g, r in zip(("y", "dx", "dw"), exact, got, ref):
      scale = np.max(np.abs(e))
      errors[f"kernel_{name}"] = float(np.max(np.abs(g - e)) / scale)
      errors[f"ragged_dot_{name}"] = float(np.max(np.abs(r - e)) / scale)
      errors[f"gap_{name}"] = float(np.max(np.abs(g - r)) / scale)
    out[case.name] = errors
  return out


def platform_kernel(device: jax.Device) -> str:
  """The kernel `grouped_matmul` runs on `device` in 16 bits; elsewhere than a GPU or TPU, megablox in the
  Pallas interpreter (what runs there is `lax.ragged_dot`, the reference itself)."""
  return {"gpu": "mosaic_gpu", "tpu": "megablox"}.get(device.platform, "megablox_interpret")


def device_errors() -> dict[str, Any]:
  """`max_errors` of `platform_kernel` on JAX's default device, named under "kernel"."""
  device = jax.devices()[0]
  kernel = platform_kernel(device)
  return {"kernel": kernel, **max_errors(kernel, device)}
