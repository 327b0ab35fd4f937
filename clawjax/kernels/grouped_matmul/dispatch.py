"""Grouped matmuls, the MoE block's expert MLPs: the rows of x sorted by group (expert), each group's rows
times its own matrix, y[r] = x[r] @ w[g] for the rows r of group g. Groups are consecutive from row 0;
rows after the last group belong to none (pairs routed to another device's experts, padding).

`grouped_matmul` chooses the kernel per platform when lowered (`lax.platform_dependent`), so a step
compiled for a TPU slice or a GPU from a CPU host gets that target's kernel:
  tpu    megablox `gmm` and `tgmm` (megablox.py): Pallas Mosaic kernels that visit only the row tiles
         holding a group, FLOPs visible to XLA's cost analysis.
  cuda   Mosaic GPU (Hopper wgmma) kernels under a custom VJP (mosaic_gpu.py), in 16-bit dtypes only (the
         gradients' wgmma transposes); float32 takes `lax.ragged_dot`.
  other  `lax.ragged_dot` (reference.py: XLA's own; CPU), which on TPU and GPU computes densely over every
         group.

Whatever a kernel leaves in the rows outside every group (its output there is undefined, also in the
input gradient), they are 0 here in y and in x's gradient, and x's values there reach neither y nor w's
gradient: they are zeroed before the kernel, since a kernel that masks by multiplying turns NaN into NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from clawjax.kernels.grouped_matmul.megablox import gmm
from clawjax.kernels.grouped_matmul.mosaic_gpu import mosaic_gpu
from clawjax.kernels.grouped_matmul.reference import ragged_dot


_BY_NAME: dict[str, Callable[..., jax.Array]] = {
    "megablox": functools.partial(gmm, interpret=False),
    "megablox_interpret": functools.partial(gmm, interpret=True),
    "mosaic_gpu": mosaic_gpu,
    "xla": ragged_dot,
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
