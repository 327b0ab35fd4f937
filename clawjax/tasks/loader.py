"""Loading tasks from any layout: a path is dispatched to the ClawGym directory layout, the ClawGym JSONL
layout or PinchBench Markdown (a directory may mix them), and a run's task set is selected from it.

Loading validates every field. A broken task becomes a `TaskError` naming the file (and line), the task
and the field; `load_tasks` returns it in place of the task, so one bad task never stops a run over
hundreds. `select_tasks` is what training and evaluation both use to pick their tasks.
"""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable, Iterable, Sequence

from clawjax.tasks.clawgym_dir import load_task_dir
from clawjax.tasks.clawgym_jsonl import load_jsonl
from clawjax.tasks.pinchbench import load_markdown_task
from clawjax.tasks.records import Task, TaskError

log = logging.getLogger(__name__)


def load_tasks(path: str | os.PathLike[str]) -> list[Task | TaskError]:
  """Loads a task directory, a JSONL file, a PinchBench .md file, or a directory of any of these
  (a directory-layout task per subdirectory, every *.jsonl and every task *.md, including a
  PinchBench checkout's `tasks/`). Broken tasks come back as TaskError entries, in order."""
  p = pathlib.Path(path)
  if p.is_file():
    if p.suffix == ".jsonl":
      return load_jsonl(p)
    if p.suffix == ".md":
      return [_catch(load_markdown_task, p)]
    return [TaskError(str(p), "not a task file (expected .jsonl or .md)")]
  if not p.is_dir():
    return [TaskError(str(p), "no such file or directory")]
  if (p / "data_entry.json").is_file():
    return [_catch(load_task_dir, p)]
  out: list[Task | TaskError] = []
  for child in _task_children(p):
    if child.is_dir():
      out.append(_catch(load_task_dir, child))
    elif child.suffix == ".jsonl":
      out.extend(load_jsonl(child))
    else:
      out.append(_catch(load_markdown_task, child))
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


def _catch(load: Callable[[pathlib.Path], Task], path: pathlib.Path) -> Task | TaskError:
  try:
    return load(path)
  except TaskError as e:
    return e


def bundled_tasks_dir() -> pathlib.Path:
  """The toy tasks shipped with clawjax (`clawjax/data/tasks/`, directory layout, real checkers)."""
  return pathlib.Path(__file__).resolve().parent.parent / "data" / "tasks"


def split_loaded(items: Iterable[Task | TaskError]) -> tuple[list[Task], list[TaskError]]:
  items = list(items)
  tasks = [t for t in items if isinstance(t, Task)]
  errors = [t for t in items if isinstance(t, TaskError)]
  return tasks, errors


def select_tasks(path: str | os.PathLike[str], task_ids: Sequence[str] = (), max_tasks: int = 0) -> list[Task]:
  """A run's tasks: the loadable tasks under `path`, only `task_ids` when given, then only the first
  `max_tasks` when it is positive, in load order.

  Broken tasks are logged and skipped, so one never stops a run. A ValueError names the ids and their
  sources when two loaded tasks share an id (rollouts, results and resumes are keyed by it), names each
  requested id that no loaded task has (and why, if that task is broken), and says so when no task is
  left.
  """
  if max_tasks < 0:
    raise ValueError(f"max_tasks: expected 0 (all) or a positive count, got {max_tasks}")
  tasks, broken = split_loaded(load_tasks(path))
  for err in broken:
    log.warning("skipping a broken task: %s", err)
  sources: dict[str, list[str]] = {}
  for t in tasks:
    sources.setdefault(t.task_id, []).append(t.source)
  repeated = {i: s for i, s in sources.items() if len(s) > 1}
  if repeated:
    listed = "; ".join(f"{i!r} ({', '.join(s)})" for i, s in sorted(repeated.items())[:5])
    more = f" and {len(repeated) - 5} more" if len(repeated) > 5 else ""
    raise ValueError(f"{path}: task ids must be unique, but {len(repeated)} occur more than once: "
                     f"{listed}{more}")
  if task_ids:
    missing = [i for i in dict.fromkeys(task_ids) if i not in sources]
    if missing:
      why = {e.task_id: e for e in broken if e.task_id in missing}
      listed = ", ".join(f"{i!r} (broken: {why[i]})" if i in why else repr(i) for i in missing)
      raise ValueError(f"task_ids: {listed} not among the {len(tasks)} loaded tasks of {path}")
    wanted = set(task_ids)
    tasks = [t for t in tasks if t.task_id in wanted]
  if max_tasks:
    tasks = tasks[:max_tasks]
  if not tasks:
    first = f"; the first of {len(broken)} broken: {broken[0]}" if broken else ""
    raise ValueError(f"{path}: no loadable task{first}")
  return tasks
