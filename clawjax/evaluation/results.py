"""The per-task results file of an evaluation run: one JSON object per line, schema `clawjax.eval/1`.

Fields (one rollout of one task):
  task_id (str), sample (int >= 0: which of the task's `num_samples` rollouts), category (str),
  harness (str: the adapter name), status ("ok" | "failed" | "timeout" | "error", as in the rollout
  record: see clawjax/harness/rollout.py), code_score, rubric_score, final_score (float in [0, 1] or
  null), metrics (object: the checker's named sub-scores), rollout_id (str), calls (int: model calls
  the shim logged), input_tokens, output_tokens (int: summed over those calls), wall_s (float),
  error (str | null: why there is no score, or the checker's error), rollout_dir (str | null: the
  kept rollout directory when `keep_dirs` is on).

The file is append-only: a rerun appends, and the last line for a (task_id, sample) wins. Each line is
flushed and fsynced before the next rollout is reported, so a killed run loses at most the line being
written; a torn last line is skipped with a warning on reading, any other bad line is an error that
names the file, line and field.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

RESULT_SCHEMA = "clawjax.eval/1"
STATUSES = ("ok", "failed", "timeout", "error")


class ResultsError(ValueError):
  """A results line that does not follow the schema; the message names file, line and field."""


@dataclasses.dataclass(frozen=True)
class TaskResult:
  task_id: str
  sample: int
  category: str
  harness: str
  status: str
  code_score: float | None
  rubric_score: float | None
  final_score: float | None
  rollout_id: str
  calls: int
  input_tokens: int
  output_tokens: int
  wall_s: float
  error: str | None = None
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)
  rollout_dir: str | None = None

  @property
  def key(self) -> tuple[str, int]:
    return self.task_id, self.sample

  def to_json(self) -> dict[str, Any]:
    return {"schema": RESULT_SCHEMA, **dataclasses.asdict(self)}


def _check(obj: Any, where: str) -> TaskResult:
  if not isinstance(obj, dict):
    raise ResultsError(f"{where}: expected a JSON object, got {type(obj).__name__}")

  def fail(field: str, message: str) -> ResultsError:
    return ResultsError(f"{where}: field {field!r}: {message}")

  if obj.get("schema") != RESULT_SCHEMA:
    raise fail("schema", f"{obj.get('schema')!r} is not {RESULT_SCHEMA!r}")
  kwargs: dict[str, Any] = {}
  for f in dataclasses.fields(TaskResult):
    if f.name not in obj:
      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise fail(f.name, "missing")
      continue
    v = obj[f.name]
    if f.name in ("task_id", "category", "harness", "rollout_id") and not isinstance(v, str):
      raise fail(f.name, f"expected a string, got {type(v).__name__}")
    if f.name in ("sample", "calls", "input_tokens", "output_tokens") and not (
        isinstance(v, int) and not isinstance(v, bool) and v >= 0):
      raise fail(f.name, f"expected an integer >= 0, got {v!r}")
    if f.name in ("code_score", "rubric_score", "final_score") and v is not None and not (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1):
      raise fail(f.name, f"expected null or a number in [0, 1], got {v!r}")
    if f.name == "wall_s" and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                   and math.isfinite(v)):
      raise fail(f.name, f"expected a finite number, got {v!r}")
    if f.name == "status" and v not in STATUSES:
      raise fail(f.name, f"{v!r} is not one of {STATUSES}")
    if f.name in ("error", "rollout_dir") and v is not None and not isinstance(v, str):
      raise fail(f.name, f"expected null or a string, got {type(v).__name__}")
    if f.name == "metrics" and not isinstance(v, dict):
      raise fail(f.name, f"expected an object, got {type(v).__name__}")
    kwargs[f.name] = v
  return TaskResult(**kwargs)


def load_results(path: str | os.PathLike[str]) -> list[TaskResult]:
  """Every valid record of a results file in file order (see the module docstring for bad lines)."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  text = path.read_text(encoding="utf-8")
  lines = text.split("\n")
  out = []
  for lineno, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    where = f"{path}:{lineno}"
    torn = lineno == len(lines) and not text.endswith("\n")
    try:
      out.append(_check(json.loads(line), where))
    except (ValueError, ResultsError) as e:
      if torn:  # the run was killed while writing this line; the rollout reruns
        log.warning("%s: skipping a torn last line (%s)", where, e)
        continue
      if isinstance(e, ResultsError):
        raise
      raise ResultsError(f"{where}: invalid JSON ({e})") from None
  return out


def latest(results: Iterable[TaskResult]) -> dict[tuple[str, int], TaskResult]:
  """The last record of each (task_id, sample)."""
  out: dict[tuple[str, int], TaskResult] = {}
  for r in results:
    out[r.key] = r
  return out


class ResultsWriter:
  """Appends results, each line flushed and fsynced before `write` returns. Not thread-safe: the
  runner writes from one thread."""

  def __init__(self, path: str | os.PathLike[str]):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    if self.path.exists():
      data = self.path.read_bytes()
      if data and not data.endswith(b"\n"):  # drop a torn last line (its rollout reruns)
        with open(self.path, "r+b") as fh:
          fh.truncate(data.rfind(b"\n") + 1)
    self._fh = open(self.path, "a", encoding="utf-8")

  def write(self, result: TaskResult) -> None:
    obj = result.to_json()
    _check(obj, f"{self.path}:<new record>")
    self._fh.write(json.dumps(obj, allow_nan=False) + "\n")
    self._fh.flush()
    os.fsync(self._fh.fileno())

  def close(self) -> None:
    self._fh.close()

  def __enter__(self) -> "ResultsWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
