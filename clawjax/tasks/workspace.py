"""Rollout workspaces: a fresh directory per rollout holding only the task's input files.

The harness runs with the workspace as its working directory (bound at `task.mount_dir` when it is
sandboxed). The checker and rubric are never written here: scoring copies the workspace elsewhere after
the harness exited (scoring.py). `diff_workspace` tells the judge which files the agent changed.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import uuid

from clawjax.tasks.records import Task, TaskFile


def _safe_name(task_id: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", task_id)[:80] or "task"


def write_files(files: tuple[TaskFile, ...], root: pathlib.Path) -> None:
  """Writes task files under `root`; shell scripts stay executable as in the source tree."""
  for f in files:
    target = root / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(f.read())
    if f.path.endswith(".sh") or (f.source is not None and os.access(f.source, os.X_OK)):
      target.chmod(0o755)


def make_workspace(task: Task, root: str | os.PathLike[str]) -> pathlib.Path:
  """Creates `root/<task id>-<random>/` with the task's input files and returns its path.

  Each call gives a new directory, so concurrent rollouts of one task never share files.
  """
  ws = pathlib.Path(root) / f"{_safe_name(task.task_id)}-{uuid.uuid4().hex[:10]}"
  ws.mkdir(parents=True)
  write_files(task.input_files, ws)
  return ws


@dataclasses.dataclass(frozen=True)
class WorkspaceDiff:
  """Paths relative to the workspace, sorted."""
  added: tuple[str, ...]
  modified: tuple[str, ...]
  deleted: tuple[str, ...]

  @property
  def changed(self) -> tuple[str, ...]:
    return tuple(sorted(self.added + self.modified))


def list_files(root: pathlib.Path) -> list[str]:
  """Relative POSIX paths of the regular files under `root` (symlinks are not followed)."""
  out = []
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      p = pathlib.Path(dirpath) / name
      if p.is_file() and not p.is_symlink():
        out.append(p.relative_to(root).as_posix())
  return sorted(out)


def diff_workspace(task: Task, workspace: str | os.PathLike[str]) -> WorkspaceDiff:
  """The workspace's files against the task's input files: added, modified (bytes differ), deleted."""
  ws = pathlib.Path(workspace)
  inputs = {f.path: f for f in task.input_files}
  present = list_files(ws)
  added = tuple(p for p in present if p not in inputs)
  modified = tuple(p for p in present if p in inputs and (ws / p).read_bytes() != inputs[p].read())
  deleted = tuple(sorted(p for p in inputs if p not in set(present)))
  return WorkspaceDiff(added=added, modified=modified, deleted=deleted)
