"""Where each process of a run keeps its files in the workdir, and which groups are its own.

One process: WORKDIR/calls/<rollout>.jsonl, WORKDIR/steps/step_<k>/rollouts.jsonl, WORKDIR/groups/.
Several (the workdir on a filesystem every host sees): each process writes under its own names,
calls/process_<i>/, steps/step_<k>/rollouts.process_<i>.jsonl, groups/process_<i>/, so that no two
processes append to one file, and every process can read the others'. Process 0 alone writes the
run-wide files (metrics.jsonl, config.json, environment.json, summary.json, plots, the report).

Group ownership: group g (clawjax.train.groups, numbered in data order) belongs to process g mod P, a
function of (step, group, process count) only, so a resumed run gives each process the same groups
again; a GRPO group never spans processes (its advantages need the whole group).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from clawjax.calllog import LoadedLog, RolloutRecord, iter_records, load
from clawjax.distributed import process_file
from clawjax.train.groups import Group


class RunLayout:

  def __init__(self, workdir: pathlib.Path, process_index: int = 0, process_count: int = 1):
    self.workdir, self.process_index, self.process_count = workdir, process_index, process_count
    sub = f"process_{process_index}"
    self.calls_dir = workdir / "calls" if process_count == 1 else workdir / "calls" / sub
    self.groups_dir = workdir / "groups" if process_count == 1 else workdir / "groups" / sub

  @property
  def primary(self) -> bool:
    return self.process_index == 0

  def per_process(self, name: str) -> str:
    """`name` for a file of this process beside the other processes' (rollouts.jsonl -> rollouts.process_1.jsonl)."""
    return process_file(name, self.process_index, self.process_count)

  def rollouts_file(self, step: int, draw: int = 0) -> pathlib.Path:
    """The rollout records of the step's task sample `draw` (0: its own; 1, 2, ...: dynamic sampling's)."""
    name = "rollouts.jsonl" if draw == 0 else f"rollouts_draw{draw}.jsonl"
    return self.workdir / "steps" / f"step_{step}" / self.per_process(name)

  def owns(self, group: Group) -> bool:
    return group.index % self.process_count == self.process_index

  def load(self, rollout_files: pathlib.Path | Sequence[pathlib.Path]) -> LoadedLog:
    """The rollout records of `rollout_files` and this process's call logs of those rollouts."""
    rollout_files = [rollout_files] if isinstance(rollout_files, pathlib.Path) else list(rollout_files)
    records = [r for f in rollout_files for r in iter_records(f) if isinstance(r, RolloutRecord)]
    calls = [p for r in records if (p := self.calls_dir / f"{r.rollout_id}.jsonl").exists()]
    return load(rollout_files + calls, errors="collect")
