"""The ClawGym JSONL layout, one task a line.

Fields: `prompt`, `hook_code` (e.g. `python3 reward/test.py <mount dir>`), `rules`/`rule` (rubric or
null), optional `task_id`/`id`, `category`, and `input_files`: a list of {`file_path`, `file_format`,
`content`}; entries under `reward/` are the checker, never the workspace. A broken line becomes a
`TaskError` in `load_jsonl`'s result, so one bad line never stops a run over hundreds of tasks.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from clawjax.tasks.fields import Fields, parse_rubric, relative_path, uses_grade_only
from clawjax.tasks.records import DEFAULT_MOUNT_DIR, REWARD_DIR, Checker, Task, TaskError, TaskFile


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
  f = Fields(obj, where, task_id)
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
    if uses_grade_only(test.read().decode("utf-8", errors="replace")):
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
