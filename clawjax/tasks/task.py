"""ClawGym tasks: the record and its loaders for the public task layouts.

A task is an instruction, the files the agent starts with, a hidden checker and, for hybrid tasks, a
rubric for an LLM judge. Three on-disk layouts load into the same `Task`:

- Directory layout (ClawGym-SynData / ClawGym-Bench): `task_XXXX/data_entry.json` with `task_id`,
  `user_query`, `input_mount_dir`, `metadata` {`category`, `grading_type`, optional `rule`};
  `input_files/` (mirrored into the workspace); `reward/reward.sh` (entry point, prints one float as its
  last stdout line) and `reward/check.py`.
- JSONL layout, one task a line: `prompt`, `hook_code` (e.g. `python3 reward/test.py <mount dir>`),
  `rules`/`rule` (rubric or null), optional `task_id`/`id`, `category`, and `input_files`: a list of
  {`file_path`, `file_format`, `content`}; entries under `reward/` are the checker, never the workspace.
- PinchBench Markdown (`tasks/*.md`): YAML front matter + `## Prompt` + `## Automated Checks` (a Python
  block defining `grade(transcript, workspace_path) -> dict`) + optional `## LLM Judge Rubric`.

Loading validates every field. A broken task becomes a `TaskError` naming the file (and line), the task
and the field; `load_jsonl`/`load_tasks` return it in place of the task so one bad line never stops a
run over hundreds of tasks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------------
# Field validation

# Builds the error for (field, message), already knowing where and which task.
Fail = Callable[[str | None, str], TaskError]


class _Fields:
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


# ---------------------------------------------------------------------------------------------------
# Directory layout


def _uses_grade_only(source: str) -> bool:
  """A check.py that only defines grade() (no script entry point) is called through grade()."""
  return (re.search(r"^def grade\s*\(", source, re.M) is not None
          and "__main__" not in source)


def _dir_checker(task_dir: pathlib.Path, mount_dir: str, fail: Fail) -> Checker | None:
  reward = task_dir / REWARD_DIR
  if not reward.is_dir():
    return None
  files = tuple(TaskFile(path=f"{REWARD_DIR}/{p.relative_to(reward).as_posix()}", source=p)
                for p in sorted(reward.rglob("*")) if p.is_file())
  if (reward / "reward.sh").is_file():
    return Checker(kind="command", files=files, command=f"bash {REWARD_DIR}/reward.sh")
  check = reward / "check.py"
  if check.is_file():
    if _uses_grade_only(check.read_text(encoding="utf-8", errors="replace")):
      return Checker(kind="grade", files=files, entry=f"{REWARD_DIR}/check.py")
    return Checker(kind="command", files=files, command=f"python3 {REWARD_DIR}/check.py {mount_dir}")
  raise fail(REWARD_DIR, "has neither reward.sh nor check.py")


def load_task_dir(path: str | os.PathLike[str]) -> Task:
  """Loads one directory-layout task (`data_entry.json`, `input_files/`, `reward/`); raises TaskError."""
  task_dir = pathlib.Path(path)
  entry_path = task_dir / "data_entry.json"
  where = str(entry_path)
  if not entry_path.is_file():
    raise TaskError(str(task_dir), "no data_entry.json (not a directory-layout task)")
  try:
    obj = json.loads(entry_path.read_text(encoding="utf-8"))
  except (ValueError, UnicodeDecodeError) as e:
    raise TaskError(where, f"invalid JSON ({e})", task_id=task_dir.name) from None
  if not isinstance(obj, dict):
    raise TaskError(where, f"expected a JSON object, got {type(obj).__name__}", task_id=task_dir.name)
  f = _Fields(obj, where, task_id=str(obj.get("task_id") or task_dir.name))
  task_id = f.string("task_id", default=task_dir.name, nonempty=True)
  f.task_id = task_id
  prompt = f.string("user_query", nonempty=True)
  mount_dir = f.string("input_mount_dir", default=DEFAULT_MOUNT_DIR, nonempty=True)
  meta = f.mapping("metadata")
  mf = _Fields(meta, where, task_id)
  category = mf.string("category", default="")
  grading_type = mf.string("grading_type", default="automated")
  rubric_raw = meta.get("rule", meta.get("rules", obj.get("rules", obj.get("rule"))))
  rubric = parse_rubric(rubric_raw, f.fail, "metadata.rule")
  inputs_dir = task_dir / "input_files"
  input_files = ()
  if inputs_dir.is_dir():
    input_files = tuple(TaskFile(path=p.relative_to(inputs_dir).as_posix(), source=p)
                        for p in sorted(inputs_dir.rglob("*")) if p.is_file())
  checker = _dir_checker(task_dir, mount_dir, f.fail)
  if checker is None and rubric is None:
    raise f.fail(REWARD_DIR, "missing: the task has neither a checker nor a rubric")
  return Task(task_id=task_id, prompt=prompt, category=category, grading_type=grading_type,
              mount_dir=mount_dir, input_files=input_files, checker=checker, rubric=rubric,
              source=str(task_dir), metadata=meta)


# ---------------------------------------------------------------------------------------------------
# JSONL layout


def _origin_template_id(template: Any) -> str | None:
  if isinstance(template, str):
    m = re.search(r"^\s*id:\s*(\S+)\s*$", template, re.M)
    if m:
      return m.group(1)
  return None


def parse_jsonl_task(obj: Any, where: str) -> Task:
  """Validates one decoded JSONL task object; raises TaskError naming `where`, the task and the field."""
  if not isinstance(obj, dict):
    raise TaskError(where, f"expected a JSON object, got {type(obj).__name__}")
  task_id = obj.get("task_id") or obj.get("id") or _origin_template_id(obj.get("origin_template"))
  if task_id is not None and not isinstance(task_id, str):
    raise TaskError(where, f"expected a string, got {type(task_id).__name__}", field="task_id")
  task_id = task_id or where
  f = _Fields(obj, where, task_id)
  prompt = f.string("prompt", nonempty=True)
  mount_dir = f.string("input_mount_dir", default=DEFAULT_MOUNT_DIR, nonempty=True)
  files_raw = obj.get("input_files") or []
  if not isinstance(files_raw, list):
    raise f.fail("input_files", f"expected a list, got {type(files_raw).__name__}")
  inputs, reward_files, seen = [], [], set()
  for i, e in enumerate(files_raw):
    field = f"input_files[{i}]"
    if not isinstance(e, dict):
      raise f.fail(field, f"expected an object, got {type(e).__name__}")
    path = relative_path(e.get("file_path"), f.fail, f"{field}.file_path")
    content = e.get("content")
    if not isinstance(content, str):
      raise f.fail(f"{field}.content", f"expected a string, got {type(content).__name__}")
    if path in seen:
      raise f.fail(f"{field}.file_path", f"{path!r} appears twice")
    seen.add(path)
    tf = TaskFile(path=path, content=content.encode("utf-8"))
    (reward_files if path.split("/")[0] == REWARD_DIR else inputs).append(tf)
  hook = obj.get("hook_code")
  if hook is not None and (not isinstance(hook, str) or not hook.strip()):
    raise f.fail("hook_code", f"expected a non-empty command string, got {hook!r}")
  checker = None
  if hook:
    # Always a shell command (`python3 reward/test.py <mount dir>`); `hook_lang` names the checker's
    # language and is kept in metadata only.
    checker = Checker(kind="command", files=tuple(reward_files), command=hook)
  elif reward_files:
    test = next((r for r in reward_files if r.path == f"{REWARD_DIR}/test.py"), None)
    if test is None:
      raise f.fail("hook_code", "missing, and no reward/test.py to run")
    if _uses_grade_only(test.read().decode("utf-8", errors="replace")):
      checker = Checker(kind="grade", files=tuple(reward_files), entry=test.path)
    else:
      checker = Checker(kind="command", files=tuple(reward_files),
                        command=f"python3 {REWARD_DIR}/test.py {mount_dir}")
  field = "rules" if "rules" in obj else "rule"
  rubric = parse_rubric(obj.get(field), f.fail, field)
  if checker is None and rubric is None:
    raise f.fail("hook_code", "missing: the task has neither a checker nor a rubric")
  category = f.string("category", default="")
  grading_type = "hybrid" if checker and rubric else ("llm_judge" if rubric else "automated")
  meta = {k: obj[k] for k in ("macro_category", "action", "hook_lang") if k in obj}
  return Task(task_id=task_id, prompt=prompt, category=category, grading_type=grading_type,
              mount_dir=mount_dir, input_files=tuple(inputs), checker=checker, rubric=rubric,
              source=where, metadata=meta)


def _reject_constant(name: str) -> Any:
  raise ValueError(f"non-standard JSON constant {name}")


def parse_jsonl_line(line: str, where: str) -> Task:
  try:
    obj = json.loads(line, parse_constant=_reject_constant)
  except ValueError as e:
    # Name the task when its id is still readable in the broken line.
    m = re.search(r'"(?:task_id|id)"\s*:\s*"([^"\\]{1,200})"', line)
    raise TaskError(where, f"invalid JSON ({e})", task_id=m.group(1) if m else None) from None
  return parse_jsonl_task(obj, where)


def load_jsonl(path: str | os.PathLike[str]) -> list[Task | TaskError]:
  """Every task of a JSONL file in order; a broken line yields a TaskError in its place."""
  path = os.fspath(path)
  out: list[Task | TaskError] = []
  with open(path, encoding="utf-8") as fh:
    for lineno, line in enumerate(fh, start=1):
      if line.strip():
        try:
          out.append(parse_jsonl_line(line, f"{path}:{lineno}"))
        except TaskError as e:
          out.append(e)
  return out


# ---------------------------------------------------------------------------------------------------
# Any layout


def load_tasks(path: str | os.PathLike[str]) -> list[Task | TaskError]:
  """Loads a task directory, a JSONL file, a PinchBench .md file, or a directory of any of these
  (a directory-layout task per subdirectory, every *.jsonl and every task *.md, including a
  PinchBench checkout's `tasks/`). Broken tasks come back as TaskError entries, in order."""
  p = pathlib.Path(path)
  if p.is_file():
    if p.suffix == ".jsonl":
      return load_jsonl(p)
    if p.suffix == ".md":
      return [_catch(lambda: _pinchbench().load_markdown_task(p))]
    return [TaskError(str(p), "not a task file (expected .jsonl or .md)")]
  if not p.is_dir():
    return [TaskError(str(p), "no such file or directory")]
  if (p / "data_entry.json").is_file():
    return [_catch(lambda: load_task_dir(p))]
  out: list[Task | TaskError] = []
  for child in _task_children(p):
    if child.is_dir():
      out.append(_catch(lambda c=child: load_task_dir(c)))
    elif child.suffix == ".jsonl":
      out.extend(load_jsonl(child))
    else:
      out.append(_catch(lambda c=child: _pinchbench().load_markdown_task(c)))
  return out


def _task_children(root: pathlib.Path) -> Iterable[pathlib.Path]:
  if (root / "tasks").is_dir() and not any(root.glob("*/data_entry.json")):
    root = root / "tasks"  # a PinchBench checkout
  for child in sorted(root.iterdir()):
    if child.is_dir() and (child / "data_entry.json").is_file():
      yield child
    elif child.is_file() and child.suffix == ".jsonl":
      yield child
    elif child.is_file() and child.suffix == ".md" and child.read_text(
        encoding="utf-8", errors="replace").startswith("---"):
      yield child


def _catch(fn: Callable[[], Task]) -> Task | TaskError:
  try:
    return fn()
  except TaskError as e:
    return e


def _pinchbench():
  from clawjax.tasks import pinchbench  # pylint: disable=import-outside-toplevel
  return pinchbench


def bundled_tasks_dir() -> pathlib.Path:
  """The toy tasks shipped with clawjax (`clawjax/data/tasks/`, directory layout, real checkers)."""
  return pathlib.Path(__file__).resolve().parent.parent / "data" / "tasks"


def split_loaded(items: Iterable[Task | TaskError]) -> tuple[list[Task], list[TaskError]]:
  items = list(items)
  tasks = [t for t in items if isinstance(t, Task)]
  errors = [t for t in items if isinstance(t, TaskError)]
  return tasks, errors


def select_tasks(path: str | os.PathLike[str], task_ids: Sequence[str] = (), max_tasks: int = 0) -> list[Task]:
  """The loadable tasks under `path`, restricted to `task_ids` when given (in load order), then to the
  first `max_tasks` (0: all).

  Broken tasks are logged and skipped, so one never stops a run; an id in `task_ids` that no loaded
  task has, a task id that occurs twice, or nothing loadable left is a ValueError naming it.
  """
  tasks, broken = split_loaded(load_tasks(path))
  for err in broken:
    log.warning("skipping a broken task: %s", err)
  if task_ids:
    missing = sorted(set(task_ids) - {t.task_id for t in tasks})
    if missing:
      raise ValueError(f"config.task_ids: {missing} not among the {len(tasks)} loaded tasks of {path}")
    tasks = [t for t in tasks if t.task_id in set(task_ids)]
  if max_tasks:
    tasks = tasks[:max_tasks]
  ids = [t.task_id for t in tasks]
  if len(set(ids)) != len(ids):
    dup = sorted({i for i in ids if ids.count(i) > 1})
    raise ValueError(f"{path}: task ids {dup[:5]} occur more than once")
  if not tasks:
    raise ValueError(f"{path}: no loadable task")
  return tasks
