"""Per-step training metrics: one JSON object a line in WORKDIR/metrics.jsonl, mirrored to TensorBoard.

Each line is {"step": int, "phase": "sft" | "rl" | "eval", "time": unix seconds, <metric>: float, ...}.
A resumed run first drops the lines of steps it is about to redo (step >= the resume step of that
phase), so the file never holds two lines for one (phase, step).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import time
from typing import Any

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"


def read_metrics(workdir: str | os.PathLike, phase: str | None = None) -> list[dict[str, Any]]:
  path = pathlib.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  rows = []
  with open(path, encoding="utf-8") as fh:
    for lineno, line in enumerate(fh, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
      if phase is None or row.get("phase") == phase:
        rows.append(row)
  return rows


class MetricsWriter:
  """Appends metrics lines (flushed per line) and TensorBoard scalars under `<phase>/<name>`."""

  def __init__(self, workdir: str | os.PathLike, tensorboard: bool = True, enabled: bool = True):
    """`enabled`: False for the processes of a multi-process run other than process 0, which writes
    the run's metrics once (then every method does nothing)."""
    self.path = pathlib.Path(workdir) / METRICS_FILE
    self.enabled = enabled
    self._tb = self._fh = None
    if not enabled:
      return
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if tensorboard:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(str(self.path.parent / TB_DIR))
    self._fh = open(self.path, "a", encoding="utf-8")

  def truncate(self, phase: str, from_step: int) -> None:
    """Forgets the lines of `phase` at step >= from_step (they are about to be redone)."""
    if not self.enabled:
      return
    keep = [r for r in read_metrics(self.path.parent) if r.get("phase") != phase or r["step"] < from_step]
    self._fh.close()
    with open(self.path, "w", encoding="utf-8") as fh:
      fh.writelines(json.dumps(r) + "\n" for r in keep)
    self._fh = open(self.path, "a", encoding="utf-8")

  def write(self, phase: str, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    self._fh.write(json.dumps({"step": step, "phase": phase, "time": time.time(), **clean}) + "\n")
    self._fh.flush()
    if self._tb is not None:
      for k, v in clean.items():
        self._tb.add_scalar(f"{phase}/{k}", v, step)
      self._tb.flush()

  def close(self) -> None:
    if self._fh is not None:
      self._fh.close()
    if self._tb is not None:
      self._tb.close()
