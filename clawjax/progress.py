"""Where a run stands, in its log: a line when a phase starts and one when it ends with its duration
(engine load and compile, shim, harness install, cold-start SFT, each step's learner update), an ETA from
the steps' wall times, and whether progress bars may redraw (only on a terminal: a log file gets lines,
never carriage returns)."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator

log = logging.getLogger("clawjax.progress")

ETA_WINDOW = 10  # the ETA assumes the mean wall time of this many latest steps


def duration(seconds: float) -> str:
  """3.2s, 4m05s, 2h07m."""
  if seconds < 60:
    return f"{seconds:.1f}s"
  minutes, secs = divmod(int(round(seconds)), 60)
  if minutes < 60:
    return f"{minutes}m{secs:02d}s"
  return f"{minutes // 60}h{minutes % 60:02d}m"


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
  """Logs `name` when it starts and `name: done in <duration>` (or `failed after`) when it ends."""
  log.info("%s ...", name)
  start = time.monotonic()
  try:
    yield
  except BaseException:
    log.info("%s: failed after %s", name, duration(time.monotonic() - start))
    raise
  log.info("%s: done in %s", name, duration(time.monotonic() - start))


class StepClock:
  """The ETA of a run's remaining steps from the wall time between consecutive `tick`s."""

  def __init__(self, last_step: int):
    self.last_step = last_step
    self._times: list[float] = []
    self._since = time.monotonic()

  def tick(self, step: int) -> str:
    """Marks `step` done; returns "ETA <duration>" for the steps after it."""
    now = time.monotonic()
    self._times.append(now - self._since)
    self._since = now
    recent = self._times[-ETA_WINDOW:]
    return f"ETA {duration(sum(recent) / len(recent) * max(self.last_step - step, 0))}"


def redraws() -> bool:
  """Whether a progress bar may redraw itself in place: stderr is a terminal."""
  return sys.stderr.isatty()
