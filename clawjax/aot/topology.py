"""Accelerator slices by name ("v5p:4x4x4", "v5e:2x2", "h200:1x1x8") as compile-only devices, and the
chip table the step-time estimate and the fit check read.

TPU slices come from libtpu (`pip install 'clawjax[tpu]'`) through
`jax.experimental.topologies.get_topology_desc`; nothing is attached and no TPU is probed. One JAX
device is one chip on every chip here (v5p's two TensorCores act as one megacore device).
"""

from __future__ import annotations

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


# Vendor figures per chip (dense bf16, no sparsity).
CHIPS: dict[str, Chip] = {
    "v5e": Chip("tpu", 16 * GIB, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e: 16 GiB HBM2, 197 TFLOP/s, 819 GB/s"),
    "v5p": Chip("tpu", 95 * GIB, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e, 459 TFLOP/s, 2765 GB/s"),
    "v6e": Chip("tpu", 32 * GIB, 918e12, 1640e9, "cloud.google.com/tpu/docs/v6e: 32 GiB HBM, 918 TFLOP/s, 1640 GB/s"),
}


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
  try:
    desc = topologies.get_topology_desc(platform=topology.chip.platform, topology_name=topology.name)
  except Exception as e:  # the plugin's own message: unknown slice shape, libtpu missing
    raise ConfigError(f"topology {topology.name!r}: {str(e).splitlines()[0]}") from None
  found = list(desc.devices)
  if len(found) != topology.device_count:
    raise ConfigError(f"topology {topology.name!r}: libtpu gives {len(found)} devices, not {topology.device_count}")
  return found
