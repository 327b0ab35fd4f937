"""The task records every layout loads into: `Task`, its files, checker and rubric, and `TaskError`.

A task is an instruction, the files the agent starts with, a hidden checker and, for hybrid tasks, a
rubric for an LLM judge. The on-disk layouts (clawgym_dir.py, clawgym_jsonl.py, pinchbench.py) fill
these records; loader.py picks the layout for a path.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Literal

DEFAULT_MOUNT_DIR = "/root/.openclaw/workspace"
# Directory of the checker files, relative to the scoring root, in both ClawGym layouts.
REWARD_DIR = "reward"


class TaskError(ValueError):
  """A task that cannot be loaded; the message names where (file[:line]), the task and the field."""

  def __init__(self, where: str, message: str, *, task_id: str | None = None,
               field: str | None = None):
    self.where, self.task_id, self.field, self.message = where, task_id, field, message
    parts = [where]
    if task_id:
      parts.append(f"task {task_id!r}")
    if field:
      parts.append(f"field {field!r}")
    super().__init__(": ".join(parts) + f": {message}")


@dataclasses.dataclass(frozen=True)
class TaskFile:
  """One file of a task: `path` is relative (to the workspace, or to the scoring root for checker
  files); the bytes are inline (`content`) or read from `source` on use."""
  path: str
  content: bytes | None = None
  source: pathlib.Path | None = None

  def read(self) -> bytes:
    if self.content is not None:
      return self.content
    assert self.source is not None
    return self.source.read_bytes()


@dataclasses.dataclass(frozen=True)
class Checker:
  """How to compute a task's code score.

  kind "command": a shell command run with the scoring root as working directory (official
  `bash reward/reward.sh`, or a JSONL `hook_code`); its stdout ends with a float or a JSON object.
  Occurrences of the task's mount dir in the command and in the checker files are rewritten to the
  scored workspace (see scoring.py).
  kind "grade": `entry` is a Python file defining `grade(transcript, workspace_path) -> dict`.
  `files` are placed under the scoring root only after the harness has exited.
  """
  kind: Literal["command", "grade"]
  files: tuple[TaskFile, ...]
  command: str | None = None
  entry: str | None = None


@dataclasses.dataclass(frozen=True)
class RubricRule:
  """One rubric criterion: `scores` maps each anchor (as a string, e.g. "0.5") to its description."""
  name: str
  file_path: str | None
  scores: dict[str, str]
  weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Rubric:
  """An LLM-judge rubric: each rule is scored on one of `score_options`; the rubric score is the
  weighted mean over rules (equal weights unless the source gives them, as PinchBench does)."""
  score_options: tuple[float, ...]
  rules: tuple[RubricRule, ...]
  text: str | None = None  # free-form rubric text shown to the judge verbatim (PinchBench)


@dataclasses.dataclass(frozen=True)
class Task:
  task_id: str
  prompt: str
  category: str
  grading_type: str  # as given by the source: e.g. "automated", "hybrid", "llm_judge"
  mount_dir: str  # where the harness expects its workspace (absolute path in the original setup)
  input_files: tuple[TaskFile, ...]
  checker: Checker | None
  rubric: Rubric | None
  source: str  # file[:line] the task was loaded from
  # Share of the code score in the final score of a judged task; None: the judge config's default.
  code_weight: float | None = None
  timeout_s: float | None = None  # the task's own wall-clock budget for the agent, when it has one
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
