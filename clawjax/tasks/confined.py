"""Runs a checker so that nothing it starts outlives it, and so that its output is read by a deadline.

ClawGym checkers run code the agent wrote (the workspace's tests). A process of theirs that calls
`setsid` (a `setsid sleep`, a double-forked daemon) leaves the checker's session: killing the session
on timeout misses it, and it holds the checker's stdout open, so reading the output to its end waits
as long as it lives. Here the checker runs as the first process of a PID namespace of its own, which
no process can leave: when that first process ends (it exits, or it is killed on timeout), the kernel
kills every other process of the namespace, and the pipes close. What this host allows is probed once
per process, in this order:

  unshare --pid --fork --kill-child --mount-proc   (as root; with -r in a user namespace otherwise):
      a fresh /proc too, so the checker sees only its own processes;
  bwrap --unshare-pid --die-with-parent            (the host's file tree bound whole, a fresh /proc);
  none                                             the checker's session only (a process that calls
                                                   setsid can outlive it), `unshare -n` where that works.

The network goes with it: `-n` / `--unshare-net` (loopback only) when asked and possible. Whatever the
mechanism, the output is read with a deadline: a run returns within its timeout plus `DRAIN_S` (plus
the kill), even where a leftover process still holds the pipe (then what was read so far is kept).
`Confinement.details()` says which mechanism ran, as a score's `details` carry it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import signal
import subprocess
import time
from typing import Any

# After the checker's first process is gone, how long its output may still take to arrive (a PID
# namespace closes the pipes at once; a leftover outside one may hold them open for ever).
DRAIN_S = 3.0


@dataclasses.dataclass(frozen=True)
class Confinement:
  prefix: tuple[str, ...]  # the command the checker's argv is appended to
  processes: str           # what holds the checker's processes, for `details`
  network: str             # how the network is cut off, for `details`

  def details(self) -> dict[str, Any]:
    return {"processes": self.processes, "network": self.network}


_UNSHARE_PID = ("--pid", "--fork", "--kill-child", "--mount-proc")
_SESSION_ONLY = "session only (no PID namespace here: a process that calls setsid can outlive the checker)"


def candidates(isolate_network: bool) -> list[Confinement]:
  """Every mechanism this host has the tools for, best first (whether one works here is `works`)."""
  out = []
  unshare, bwrap = shutil.which("unshare"), shutil.which("bwrap")
  net = lambda how: how if isolate_network else "not isolated"
  users = ((), ("-r",))  # as root; as another user, in a user namespace of its own
  if unshare:
    out += [Confinement(("unshare", *user, *(("-n",) if isolate_network else ()), *_UNSHARE_PID),
                        "pid namespace (unshare --pid --fork --kill-child)", net(" ".join(("unshare", *user, "-n"))))
            for user in users]
  if bwrap:
    out.append(Confinement((bwrap, "--dev-bind", "/", "/", "--proc", "/proc", "--unshare-pid",
                            *(("--unshare-net",) if isolate_network else ()), "--die-with-parent", "--"),
                           "pid namespace (bwrap --unshare-pid --die-with-parent)", net("bwrap --unshare-net")))
  if unshare and isolate_network:
    out += [Confinement(("unshare", *user, "-n"), _SESSION_ONLY, " ".join(("unshare", *user, "-n"))) for user in users]
  return out + [Confinement((), _SESSION_ONLY, net("none (unshare unavailable: the checker can reach the network)"))]


def works(candidate: Confinement) -> bool:
  if not candidate.prefix:
    return True
  try:
    return subprocess.run([*candidate.prefix, "true"], capture_output=True, timeout=10).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


@functools.cache
def confinement(isolate_network: bool) -> Confinement:
  """The best mechanism that works on this host (see the module docstring)."""
  return next(c for c in candidates(isolate_network) if works(c))


@dataclasses.dataclass
class ProcessRun:
  returncode: int | None  # None: killed on timeout
  stdout: str
  stderr: str
  wall_s: float


def _drain(proc: subprocess.Popen) -> tuple[bytes, bytes]:
  """What is left of the output, waiting at most DRAIN_S for the pipes to close."""
  try:
    return proc.communicate(timeout=DRAIN_S)
  except subprocess.TimeoutExpired as e:  # a leftover outside any namespace holds the pipes
    proc.stdout.close()
    proc.stderr.close()
    proc.wait()
    return e.stdout or b"", e.stderr or b""


def run_confined(argv: list[str], cwd: pathlib.Path, env: dict[str, str], timeout_s: float,
                 how: Confinement) -> ProcessRun:
  """Runs `argv` under `how` (see the module docstring); returns within timeout_s + DRAIN_S (and the kill)."""
  t0 = time.monotonic()
  proc = subprocess.Popen([*how.prefix, *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
  try:
    out, err = proc.communicate(timeout=timeout_s)
    rc: int | None = proc.returncode
  except subprocess.TimeoutExpired:
    # Outside a namespace, the checker may have exited and left a process holding its output: then
    # it was not a timeout.
    rc = proc.poll()
    if rc is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)  # the namespace's first process with it, so all of it
      except ProcessLookupError:
        pass
    out, err = _drain(proc)
  return ProcessRun(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.monotonic() - t0)
