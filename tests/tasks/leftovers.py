"""Finding a checker's processes from the host's /proc by a marker in their command line (a checker in
a PID namespace knows only its namespace's pids)."""
from __future__ import annotations

import os
import pathlib
import time


def alive(marker: str) -> list[int]:
  """Host pids of the processes (not zombies) whose command line holds `marker`."""
  out = []
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit() or int(proc.name) == os.getpid():
      continue
    try:
      if marker.encode() in (proc / "cmdline").read_bytes() and (proc / "stat").read_text().split()[2] != "Z":
        out.append(int(proc.name))
    except (FileNotFoundError, ProcessLookupError, IndexError):
      continue
  return out


def gone(marker: str, wait_s: float = 5.0) -> bool:
  """Whether every process holding `marker` has ended, waiting up to `wait_s` (a kill is not instant)."""
  deadline = time.monotonic() + wait_s
  while alive(marker):
    if time.monotonic() > deadline:
      return False
    time.sleep(0.1)
  return True
