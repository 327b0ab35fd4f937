"""Grouped matmuls: the TPU kernels (megablox, in Pallas interpret mode) and `lax.ragged_dot` equal float64
brute force, output and gradients, on the shapes of clawjax/kernels/grouped_matmul/check.py (empty groups,
groups inside tiles, NaN rows outside every group, dimensions off the tiles); and the step lowered for a
TPU or a GPU from this host gets that platform's kernel, with no XLA ragged dot left."""
from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clawjax.kernels.grouped_matmul import grouped_matmul
from clawjax.kernels.grouped_matmul.check import CASES, Case, max_errors
from tests.aot import devices_or_skip

# Relative to the largest float64 value: float32 rounding, and bfloat16's (the output's rounding, 2^-9).
_BOUND = {"float32": 2e-6, "bfloat16": 8e-3}


@pytest.mark.parametrize("kernel", ["megablox_interpret", "xla"])
def test_kernel_equals_float64_brute_force(kernel):
  errors = max_errors(kernel)
  for case in CASES:
    for name, value in errors[case.name].items():
      if name.startswith("kernel_"):
        assert value <= _BOUND[case.dtype], (case.name, name, value)  # a NaN fails too


@pytest.mark.slow
def test_benchmark_times_each_kernel_beside_its_check():
  """benchmarks/grouped_matmul_kernels.py at toy size on the CPU: the TPU kernel in the interpreter and
  `lax.ragged_dot` each timed, each with its check's errors (what it reports on a GPU or TPU)."""
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
  import grouped_matmul_kernels  # pylint: disable=import-outside-toplevel
  out = grouped_matmul_kernels.main(["--json", "--tokens", "32", "--top-k", "2", "--k", "128", "--n", "128",
                                     "--experts", "4", "--repeats", "1"])
  assert out["rows"] == 64
  for kernel in ("megablox_interpret", "xla"):
    assert out[kernel]["step_s"] > 0 and out[kernel]["tflops_per_s"] > 0
    assert set(out[kernel]["errors"]) == {case.name for case in CASES}
    assert out[kernel]["errors"]["ragged_bf16"]["kernel_dx"] <= _BOUND["bfloat16"]


def test_unknown_kernel_is_named():
  with pytest.raises(ValueError, match="kernel 'cuda' is not one of"):
    grouped_matmul(jnp.zeros((4, 2)), jnp.zeros((1, 2, 3)), jnp.array([4]), kernel="cuda")


def _lowered(slice_name: str, case: Case) -> str:
  """StableHLO of the value and both gradients of a grouped matmul of `case`'s shapes, lowered for one
  device of the slice."""
  mesh = Mesh(np.array(devices_or_skip(slice_name)[:1]), ("x",))
  placed = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, P()))
  loss = lambda x, w, g: jnp.sum(grouped_matmul(x, w, g).astype(jnp.float32) ** 2)
  groups = len(case.group_sizes)
  args = (placed((case.rows, case.k), case.dtype), placed((groups, case.k, case.n), case.dtype),
          placed((groups,), jnp.int32))
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).as_text()


def test_lowered_for_tpu_runs_megablox():
  text = _lowered("v5p:2x2x1", CASES[0])
  assert text.count("tpu_custom_call") == 3 and "ragged_dot" not in text  # gmm, its transpose, tgmm


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lowered_for_hopper_runs_mosaic_gpu_in_16_bits(case):
  text = _lowered("h200:1x1x1", case)
  if case.dtype == "float32":  # Hopper's wgmma transposes no 32-bit operand: XLA's ragged dot
    assert "mosaic_gpu" not in text
  else:
    assert text.count("mosaic_gpu") >= 3 and "ragged_dot" not in text
