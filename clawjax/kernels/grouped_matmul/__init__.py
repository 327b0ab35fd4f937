"""Grouped matmul, the MoE block's expert MLPs: the rows of x sorted by group (expert), each group's rows
times its own matrix. The model calls `grouped_matmul` (dispatch.py), which picks the kernel of the
platform it is lowered for: megablox on TPU (megablox.py), Mosaic GPU on Hopper (mosaic_gpu.py),
`lax.ragged_dot` elsewhere (reference.py). check.py holds the numerical check of a kernel against float64
brute force and the reference that the tests and the device check (scripts/device_check.py) run.
"""

from clawjax.kernels.grouped_matmul.dispatch import grouped_matmul

__all__ = ["grouped_matmul"]
