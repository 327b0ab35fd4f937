"""`import jax` without the CUDA plugin's start-up log lines on a host that has no NVIDIA driver.

Compiling for GPU targets from any host needs XLA's CUDA plugin installed (the `gpu-aot` extra, which
scripts/env.sh installs). jaxlib loads the plugin's kernel libraries whenever jax is imported, and on a
host without a driver each library writes to the process's stderr, below Python, that it found none (six
lines, whatever JAX_PLATFORMS says). The command-line entry points import jax through `import_jax` first,
so that a CPU run's stderr holds what clawjax says: its one-line errors stay one line. Where a driver
exists, or jax is already imported, it is a plain import; a Python exception from the import is raised as
ever (only native writes during it are dropped).
"""

from __future__ import annotations

import glob
import os
import sys


def import_jax() -> None:
  if "jax" in sys.modules or glob.glob("/dev/nvidia[0-9]*"):
    return
  saved = os.dup(2)
  try:
    with open(os.devnull, "wb") as null:
      os.dup2(null.fileno(), 2)
      import jax  # pylint: disable=import-outside-toplevel,unused-import
  finally:
    os.dup2(saved, 2)
    os.close(saved)
