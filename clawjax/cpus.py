"""CPU core sets: a Linux cpu list ("0-3,8", as `taskset -c` and cpusets write them) and the calling
thread pinned to one.

On Linux a thread's affinity is its own, and threads and processes it starts inherit it. So pinning the
threads that drive rollouts (and the thread that starts the shim) moves the whole rollout side of a
process onto its cores (the harness sandboxes, checkers and shim processes they start included), while
the process's other threads, the learner's, keep theirs.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from clawjax.config import ConfigError


def parse_cpu_list(text: str, field: str) -> frozenset[int]:
  """The cores of a cpu list; "" is the empty set (no pinning). ConfigError names `field`."""
  cores: set[int] = set()
  for part in filter(None, (p.strip() for p in text.split(","))):
    lo, sep, hi = part.partition("-")
    try:
      first, last = int(lo), int(hi if sep else lo)
    except ValueError:
      raise ConfigError(f"{field}: {text!r} is not a cpu list like '0-3,8' ({part!r})") from None
    if first < 0 or last < first:
      raise ConfigError(f"{field}: {text!r} has the empty or negative range {part!r}")
    cores.update(range(first, last + 1))
  return frozenset(cores)


def check_available(cores: frozenset[int], field: str) -> None:
  """ConfigError unless a thread of this process may run on exactly `cores`: tried on a short-lived
  thread, since the caller's own thread may already be pinned elsewhere."""
  if not cores:
    return
  failed: list[str] = []

  def probe() -> None:
    try:
      os.sched_setaffinity(0, cores)
    except OSError as e:
      failed.append(f"none of them can be used here ({e.strerror})")
      return
    if os.sched_getaffinity(0) != cores:  # Linux drops the cores a cpuset does not allow
      failed.append(f"only {sorted(os.sched_getaffinity(0))} can be used here")

  probe_thread = threading.Thread(target=probe, name="clawjax-cpu-probe")
  probe_thread.start()
  probe_thread.join()
  if failed:
    raise ConfigError(f"{field}: cores {sorted(cores)}: {failed[0]}")


def pin_thread(cores: frozenset[int]) -> None:
  """Pins the calling thread (not its process) to `cores`; the empty set leaves it as it is."""
  if cores:
    os.sched_setaffinity(0, cores)  # pid 0: the calling thread, on Linux


@contextlib.contextmanager
def thread_pinned(cores: frozenset[int]) -> Iterator[None]:
  """The calling thread on `cores` for the block (what it starts there keeps them), then back."""
  before = os.sched_getaffinity(0)
  pin_thread(cores)
  try:
    yield
  finally:
    if cores:
      os.sched_setaffinity(0, before)
