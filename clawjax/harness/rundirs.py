"""The directories a run's rollouts live in, owned by the process that made them, and the removal of those a
killed run left behind.

Every process that runs rollouts is one run with a fresh id (UTC start time, pid, random suffix). Its
rollout dirs (workspace, HOME, harness output) lie under WORK_ROOT/clawjax-rollouts/<run id>/, its relay
sockets under TMP/clawjax-relay/<run id>/ (kept short: a socket path must fit in 108 bytes). Each such
run dir holds `owner.lock`, locked (flock) for as long as the process lives; the kernel drops the lock
when the process dies however it dies, so a run dir whose lock can be taken belongs to a dead run. At a
normal exit the run removes its run dirs that hold nothing else and deletes the lock file of those it
keeps (`RolloutConfig.keep_dirs`), so kept dirs are never taken for leftovers.

`remove_leftovers` removes the run dirs of dead runs, and only those: dirs without an `owner.lock` (kept
ones, or another program's) and dirs of live runs are never touched. A run calls it for each root the
first time it uses it, so the next start after a kill -9 cleans up; a resumed run has a new id and so
never reuses a dead run's dirs.
"""

from __future__ import annotations

import atexit
import datetime
import fcntl
import json
import os
import pathlib
import secrets
import shutil
import stat
import tempfile
import threading

ROLLOUTS = "clawjax-rollouts"
RELAYS = "clawjax-relay"
OWNER_LOCK = "owner.lock"


def rollouts_root(work_root: str | os.PathLike[str] | None) -> pathlib.Path:
  """Where runs keep their rollout dirs: WORK_ROOT (default: the system temp dir)/clawjax-rollouts."""
  return pathlib.Path(work_root or tempfile.gettempdir()) / ROLLOUTS


def relays_root() -> pathlib.Path:
  """Where runs keep their relay sockets: the system temp dir (short paths)/clawjax-relay."""
  return pathlib.Path(tempfile.gettempdir()) / RELAYS


def _rmtree(path: pathlib.Path) -> None:
  """Removes `path`, making read-only dirs writable on the way (harnesses leave such caches in HOME)."""
  def retry(func, p, _):
    try:
      os.chmod(os.path.dirname(p), stat.S_IRWXU)
      if os.path.isdir(p) and not os.path.islink(p):
        os.chmod(p, stat.S_IRWXU)
      func(p)
    except OSError:
      pass
  shutil.rmtree(path, onerror=retry)


def remove_dead_runs(parent: pathlib.Path) -> list[pathlib.Path]:
  """Removes each run dir under `parent` whose owner lock can be taken (its run is dead); returns them."""
  removed = []
  try:
    children = sorted(parent.iterdir())
  except (FileNotFoundError, NotADirectoryError):
    return removed
  for run_dir in children:
    lock_path = run_dir / OWNER_LOCK
    try:
      fd = os.open(lock_path, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
      continue  # no owner: a kept run dir, or not one of ours
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        continue  # its run is alive
      try:  # a run that ended normally deletes its lock file before releasing it: then the dir is kept
        if os.stat(lock_path).st_ino != os.fstat(fd).st_ino:
          continue
      except FileNotFoundError:
        continue
      _rmtree(run_dir)
      removed.append(run_dir)
    finally:
      os.close(fd)
  return removed


def remove_leftovers(work_root: str | os.PathLike[str] | None = None) -> list[pathlib.Path]:
  """Removes the rollout dirs (under `work_root`, as `RolloutConfig.work_root`) and relay dirs of dead runs;
  returns what it removed. Safe while other runs are live: their dirs stay."""
  return remove_dead_runs(rollouts_root(work_root)) + remove_dead_runs(relays_root())


class Run:
  """One process's claim on its run dirs: `dir(parent)` is parent/<run id>, made and locked on first use."""

  def __init__(self, run_id: str | None = None):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    self.run_id = run_id or f"{stamp}-{os.getpid()}-{secrets.token_hex(4)}"
    self._owned: dict[pathlib.Path, int] = {}  # run dir -> fd holding its owner lock
    self._mutex = threading.Lock()

  def dir(self, parent: str | os.PathLike[str]) -> pathlib.Path:
    """This run's dir under `parent`; the first call removes dead runs' dirs there, then makes it."""
    run_dir = pathlib.Path(parent) / self.run_id
    with self._mutex:
      if run_dir not in self._owned:
        remove_dead_runs(run_dir.parent)
        self._owned[run_dir] = self._claim(run_dir)
    return run_dir

  def _claim(self, run_dir: pathlib.Path) -> int:
    """Makes `run_dir` already locked: the lock file is locked under another name, then renamed into a
    staging dir, then the dir into place, so no other process ever sees it unlocked."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{self.run_id}-", dir=run_dir.parent))
    fd = os.open(staging / f".{OWNER_LOCK}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"run_id": self.run_id, "pid": os.getpid(),
                             "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}).encode())
    os.rename(staging / f".{OWNER_LOCK}", staging / OWNER_LOCK)
    os.rename(staging, run_dir)
    return fd

  def close(self) -> None:
    """Releases the run dirs: removes those holding only the lock, keeps the others without their lock."""
    with self._mutex:
      for run_dir, fd in self._owned.items():
        try:
          if [p.name for p in run_dir.iterdir()] == [OWNER_LOCK]:
            _rmtree(run_dir)
          else:
            (run_dir / OWNER_LOCK).unlink(missing_ok=True)
        except FileNotFoundError:
          pass  # removed by hand meanwhile
        os.close(fd)
      self._owned.clear()


_current: Run | None = None
_current_mutex = threading.Lock()


def current_run() -> Run:
  """This process's run, made on first use and released at exit."""
  global _current
  with _current_mutex:
    if _current is None:
      _current = Run()
      atexit.register(_current.close)
    return _current
