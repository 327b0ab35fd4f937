"""Field validation shared by the task layouts: typed access to a JSON object's fields, safe relative
paths, the ClawGym rubric object, and how a checker script is called. Every failure is a `TaskError`
naming the source, the task and the field."""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Callable
from typing import Any

from clawjax.tasks.records import Rubric, RubricRule, TaskError

# Builds the error for (field, message), already knowing where and which task.
Fail = Callable[[str | None, str], TaskError]


class Fields:
  """Typed access to one JSON object's fields; failures name the source, the task and the field."""

  def __init__(self, obj: dict[str, Any], where: str, task_id: str | None = None):
    self.obj, self.where, self.task_id = obj, where, task_id

  def fail(self, field: str | None, message: str) -> TaskError:
    return TaskError(self.where, message, task_id=self.task_id, field=field)

  def string(self, field: str, *, default: str | None = None, nonempty: bool = False) -> str:
    v = self.obj.get(field)
    if v is None:
      if default is None:
        raise self.fail(field, "missing")
      return default
    if not isinstance(v, str):
      raise self.fail(field, f"expected a string, got {type(v).__name__}")
    if nonempty and not v.strip():
      raise self.fail(field, "empty")
    return v

  def mapping(self, field: str) -> dict[str, Any]:
    v = self.obj.get(field)
    if v is None:
      return {}
    if not isinstance(v, dict):
      raise self.fail(field, f"expected an object, got {type(v).__name__}")
    return v


def relative_path(p: Any, fail: Fail, field: str) -> str:
  """A safe relative POSIX path: no absolute paths, no `..`, so files stay inside their root."""
  if not isinstance(p, str) or not p.strip():
    raise fail(field, f"expected a non-empty relative path, got {p!r}")
  pure = pathlib.PurePosixPath(p.replace("\\", "/"))
  if pure.is_absolute() or ".." in pure.parts:
    raise fail(field, f"path {p!r} leaves its directory")
  return str(pure)


def parse_rubric(raw: Any, fail: Fail, field: str) -> Rubric | None:
  """The ClawGym rubric object ({eval_type, score_options, rules: [{name, file_path, scores}]}), which
  may also arrive JSON-encoded as a string; None/empty -> no rubric."""
  if raw is None or raw == "" or raw == {}:
    return None
  if isinstance(raw, str):
    try:
      raw = json.loads(raw)
    except ValueError as e:
      raise fail(field, f"rubric is a string but not JSON ({e})") from None
  if not isinstance(raw, dict):
    raise fail(field, f"expected a rubric object, got {type(raw).__name__}")
  options = raw.get("score_options", [0, 0.25, 0.5, 0.75, 1])
  if (not isinstance(options, list) or not options
      or not all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in options)):
    raise fail(f"{field}.score_options", f"expected a non-empty list of numbers, got {options!r}")
  rules_raw = raw.get("rules")
  if not isinstance(rules_raw, list) or not rules_raw:
    raise fail(f"{field}.rules", "expected a non-empty list of criteria")
  rules, names = [], set()
  for i, r in enumerate(rules_raw):
    where = f"{field}.rules[{i}]"
    if not isinstance(r, dict):
      raise fail(where, f"expected an object, got {type(r).__name__}")
    name = r.get("name")
    if not isinstance(name, str) or not name.strip():
      raise fail(f"{where}.name", "missing or empty")
    if name in names:
      raise fail(f"{where}.name", f"criterion {name!r} appears twice")
    names.add(name)
    file_path = r.get("file_path")
    if file_path is not None and not isinstance(file_path, str):
      raise fail(f"{where}.file_path", f"expected a string, got {type(file_path).__name__}")
    scores = r.get("scores", {})
    if not isinstance(scores, dict) or not all(isinstance(v, str) for v in scores.values()):
      raise fail(f"{where}.scores", "expected an object of anchor -> description")
    weight = r.get("weight", 1.0)
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
      raise fail(f"{where}.weight", f"expected a non-negative number, got {weight!r}")
    rules.append(RubricRule(name=name, file_path=file_path or None,
                            scores={str(k): v for k, v in scores.items()}, weight=float(weight)))
  return Rubric(score_options=tuple(float(o) for o in options), rules=tuple(rules))


def uses_grade_only(source: str) -> bool:
  """A check.py that only defines grade() (no script entry point) is called through grade()."""
  return (re.search(r"^def grade\s*\(", source, re.M) is not None
          and "__main__" not in source)
