"""Where clawjax keeps what it builds on first use (converted weights, installed harnesses and engines)."""

import contextlib
import fcntl
import os
import pathlib
from collections.abc import Iterator

_STAMP = ".clawjax-installed"


def cache_dir(*parts: str) -> pathlib.Path:
  """$CLAWJAX_CACHE (default ~/.cache/clawjax) joined with `parts`, created if missing."""
  root = pathlib.Path(os.environ.get("CLAWJAX_CACHE", pathlib.Path.home() / ".cache" / "clawjax"))
  path = root.joinpath(*parts)
  path.mkdir(parents=True, exist_ok=True)
  return path


def installed(target: pathlib.Path, spec: str) -> bool:
  """Whether a finished install of `spec` is in `target` (see `install_once`)."""
  stamp = target / _STAMP
  return stamp.exists() and stamp.read_text().strip() == spec


@contextlib.contextmanager
def install_once(target: pathlib.Path, spec: str) -> Iterator[bool]:
  """Serialises installers of `spec` into the cache directory `target` (a file lock: parallel test
  workers) and yields whether it must still be installed. When it must, the caller installs inside the
  block; a stamp written after the block, only if it raised nothing, marks the install finished, so an
  interrupted one is redone and a finished one is never touched again."""
  with open(target / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if installed(target, spec):
      yield False
      return
    yield True
    (target / _STAMP).write_text(spec + "\n")
