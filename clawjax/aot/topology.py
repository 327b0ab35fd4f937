"""Accelerator slices by name ("v5p:4x4x4", "v5e:2x2", "h200:1x1x8") as compile-only devices, and the
chip table the step-time estimate and the fit check read.

TPU slices come from libtpu (`pip install 'clawjax[tpu]'`), GPU nodes from XLA's CUDA compiler
(`pip install 'clawjax[gpu-aot]'`, no CUDA libraries needed), both through
`jax.experimental.topologies.get_topology_desc`: nothing is attached and no accelerator is probed. One
JAX device is one chip (v5p's two TensorCores act as one megacore device) or one GPU. A GPU name's
dimensions are XLA's: slices x hosts x GPUs per host ("h200:1x1x8" is one 8-GPU node); its compiler is
told the GPU by a GpuTargetConfig written here from the Hopper architecture and the chip's row below. On
GPU, XLA gives no cost analysis and warns rather than refuses a program over memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import jax
from jax.experimental import topologies

from clawjax.config import ConfigError

GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
  platform: str        # "tpu" | "cuda"
  hbm_bytes: int       # memory per device
  peak_flops: float    # dense bf16 FLOP/s per device
  hbm_bandwidth: float  # bytes/s per device
  source: str
  sm_count: int = 0    # GPUs: streaming multiprocessors (the GpuTargetConfig's core_count)
  device_kind: str = ""  # what JAX's `device_kind` of such a device contains


# Vendor figures per chip (dense bf16, no sparsity).
CHIPS: dict[str, Chip] = {
    "v5e": Chip("tpu", 16 * GIB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e: 16 GiB HBM2, 197 TFLOP/s, 819 GB/s",
                device_kind="TPU v5 lite"),
    "v5p": Chip("tpu", 95 * GIB, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e, 459 TFLOP/s, 2765 GB/s",
                device_kind="TPU v5p"),
    "v6e": Chip("tpu", 32 * GIB, 918e12, 1640e9, "cloud.google.com/tpu/docs/v6e: 32 GiB HBM, 918 TFLOP/s, 1640 GB/s",
                device_kind="TPU v6 lite"),
    "h100": Chip("cuda", 80 * GIB, 989e12, 3.35e12, "nvidia.com/en-us/data-center/h100 (SXM): 80 GB HBM3, "
                 "989 TFLOP/s bf16 dense (1979 with sparsity), 3.35 TB/s, 132 SMs", sm_count=132, device_kind="H100"),
    "h200": Chip("cuda", 141 * GIB, 989e12, 4.8e12, "nvidia.com/en-us/data-center/h200 (SXM): 141 GB HBM3e, "
                 "989 TFLOP/s bf16 dense (1979 with sparsity), 4.8 TB/s, 132 SMs", sm_count=132, device_kind="H200"),
}

# What XLA's GPU compiler needs to know of a Hopper GPU (sm_90: CUDA programming guide's compute
# capability 9.0 limits; 50 MiB L2, 1.98 GHz boost clock) besides the chip's own row.
_HOPPER_TARGET = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {sm_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
device_description_str: "NVIDIA {name}"
"""


def chip_of(device_kind: str) -> Chip | None:
  """The chip whose `device_kind` a running device's reports ("NVIDIA H200", "TPU v5 lite"), or None."""
  return next((chip for chip in CHIPS.values() if chip.device_kind and chip.device_kind in device_kind), None)


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str                  # as given, e.g. "v5p:4x4x4"
  chip_name: str
  chip: Chip
  shape: tuple[int, ...]     # chips along each torus / node axis

  @property
  def device_count(self) -> int:
    return math.prod(self.shape)


def parse(name: str) -> Topology:
  """"v5p:4x4x4" -> Topology; a one-line ConfigError naming what is wrong."""
  chip_name, sep, dims = name.partition(":")
  if not sep or chip_name not in CHIPS:
    raise ConfigError(f"topology {name!r}: expected CHIP:AxB[xC] with CHIP one of {sorted(CHIPS)}")
  try:
    shape = tuple(int(d) for d in dims.split("x"))
  except ValueError:
    raise ConfigError(f"topology {name!r}: the dimensions {dims!r} are not AxB[xC]") from None
  if not shape or min(shape) < 1:
    raise ConfigError(f"topology {name!r}: the dimensions {dims!r} must be positive")
  return Topology(name, chip_name, CHIPS[chip_name], shape)


def devices(topology: Topology) -> list[jax.Device]:
  """The slice's compile-only devices (in the order a Mesh reshapes)."""
  # libtpu takes a host-wide lockfile as if it would own the chips; compile-only devices own none, so
  # several compiles (and a TPU run beside them) may share the host. Off a TPU VM it would also look up
  # the VM's workers and warn at length: a description is one host's.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  chip = topology.chip
  try:
    if chip.platform == "cuda":
      target = _HOPPER_TARGET.format(sm_count=chip.sm_count, bandwidth=int(chip.hbm_bandwidth),
                                     memory=chip.hbm_bytes, name=topology.chip_name.upper())
      desc = topologies.get_topology_desc(platform="cuda", topology="x".join(map(str, topology.shape)),
                                          target_config=target)
    else:
      desc = topologies.get_topology_desc(platform="tpu", topology_name=topology.name)
  except Exception as e:  # the plugin's own message: unknown slice shape, plugin not installed
    raise ConfigError(f"topology {topology.name!r}: {str(e).splitlines()[0]}") from None
  found = list(desc.devices)
  if len(found) != topology.device_count:
    raise ConfigError(f"topology {topology.name!r}: the compiler gives {len(found)} devices, not {topology.device_count}")
  return found


def lowering_for(device: jax.Device) -> contextlib.AbstractContextManager:
  """The context in which to lower a program for compile-only devices: one of them (`device`) as JAX's
  default device. A Pallas Triton kernel is lowered for the GPU JAX names as the target: JAX >= 0.11 asks the
  default device (or an abstract mesh's) and refuses this host's CPU; JAX 0.10 assumed a Hopper GPU when
  none was attached. Harmless for TPU slices."""
  return jax.default_device(device)
