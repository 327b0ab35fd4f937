"""Where clawjax keeps what it builds on first use (converted weights, installed harnesses and engines), and
where it reads the locks those installs follow (`third_party/` of the checkout)."""

import contextlib
import fcntl
import hashlib
import os
import pathlib
from collections.abc import Iterator

_STAMP = ".clawjax-installed"

# The manifests and lockfiles of every component installed at run time (see third_party/README.md).
THIRD_PARTY = pathlib.Path(__file__).resolve().parent.parent / "third_party"


def cache_dir(*parts: str) -> pathlib.Path:
  """$CLAWJAX_CACHE (default ~/.cache/clawjax) joined with `parts`, created if missing."""
  root = pathlib.Path(os.environ.get("CLAWJAX_CACHE", pathlib.Path.home() / ".cache" / "clawjax"))
  path = root.joinpath(*parts)
  path.mkdir(parents=True, exist_ok=True)
  return path


def read_lock(path: pathlib.Path) -> bytes:
  """The bytes of a manifest or lockfile, or a FileNotFoundError that says where locks come from."""
  try:
    return path.read_bytes()
  except FileNotFoundError:
    raise FileNotFoundError(
        f"{path} is missing: clawjax installs its harnesses and engines from the locks in third_party/ of "
        "its checkout (install clawjax with `pip install -e CHECKOUT`; third_party/README.md says how each "
        "lock is rewritten)") from None


def lock_stamp(spec: str, lock: bytes) -> str:
  """The stamp of `spec` installed from the lockfile `lock`: a changed lock is a different install."""
  return f"{spec} lock-sha256={hashlib.sha256(lock).hexdigest()}"


def installed(target: pathlib.Path, spec: str) -> bool:
  """Whether a finished install of `spec` is in `target` (see `install_once`)."""
  stamp = target / _STAMP
  return stamp.exists() and stamp.read_text().strip() == spec


@contextlib.contextmanager
def install_once(target: pathlib.Path, spec: str) -> Iterator[bool]:
  """Serialises installers of `spec` into the cache directory `target` (a file lock: parallel test
  workers) and yields whether it must still be installed. When it must, the caller installs inside the
  block; a stamp written after the block, only if it raised nothing, marks the install finished, so an
  interrupted one is redone and a finished one is never touched again. A stamp of another spec (an older
  lock) is removed before the block, so an interrupted reinstall is never taken for the old install."""
  with open(target / ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if installed(target, spec):
      yield False
      return
    (target / _STAMP).unlink(missing_ok=True)
    yield True
    (target / _STAMP).write_text(spec + "\n")
