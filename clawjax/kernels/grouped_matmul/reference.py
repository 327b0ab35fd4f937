"""The reference of the grouped matmul: XLA's own `lax.ragged_dot`, what runs where no kernel does (a CPU),
and what every kernel is checked against (check.py). On TPU XLA computes its weight gradient densely over
every group (n_groups x the FLOPs), on GPU the forward and both gradients: 4.45 x the FLOPs of the
Qwen3-30B-A3B step at 8K on TPU, 78 GiB of temporaries on GPU (BENCHMARKS.md)."""

from __future__ import annotations

import jax


def ragged_dot(x_MK: jax.Array, w_GKN: jax.Array, group_sizes_G: jax.Array) -> jax.Array:
  # Looked up at each call, not bound at import: tests substitute a ragged_dot whose rows outside the
  # groups are garbage.
  return jax.lax.ragged_dot(x_MK, w_GKN, group_sizes_G)
