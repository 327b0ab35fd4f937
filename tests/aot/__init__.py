"""Helpers of the compile tests."""
from __future__ import annotations

import jax
import pytest

from clawjax.aot import topology
from clawjax.config import ConfigError


def devices_or_skip(slice_name: str) -> list[jax.Device]:
  """The slice's compile-only devices, or a skip where this install has no compiler for it (the tpu and
  gpu-aot extras)."""
  try:
    return topology.devices(topology.parse(slice_name))
  except ConfigError as e:
    pytest.skip(str(e))
