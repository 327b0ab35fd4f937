"""The ClawGym directory layout (ClawGym-SynData / ClawGym-Bench), one task per directory.

`task_XXXX/data_entry.json` with `task_id`, `user_query`, `input_mount_dir`, `metadata` {`category`,
`grading_type`, optional `rule`}; `input_files/` (mirrored into the workspace); `reward/reward.sh` (entry
point, prints one float as its last stdout line) and `reward/check.py`.
"""

from __future__ import annotations

import json
import os
import pathlib

from clawjax.tasks.fields import Fail, Fields, parse_rubric, uses_grade_only
from clawjax.tasks.records import DEFAULT_MOUNT_DIR, REWARD_DIR, Checker, Task, TaskError, TaskFile


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
    if uses_grade_only(check.read_text(encoding="utf-8", errors="replace")):
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
  f = Fields(obj, where, task_id=str(obj.get("task_id") or task_dir.name))
  task_id = f.string("task_id", default=task_dir.name, nonempty=True)
  f.task_id = task_id
  prompt = f.string("user_query", nonempty=True)
  mount_dir = f.string("input_mount_dir", default=DEFAULT_MOUNT_DIR, nonempty=True)
  meta = f.mapping("metadata")
  mf = Fields(meta, where, task_id)
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
