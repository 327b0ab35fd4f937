"""Asynchronous RL (`config.async_rl`): rollouts run while the learner updates.

Staleness is bounded at admission, as in AReaL: with the learner at policy version v (v steps trained),
groups are launched, in data order, only while the groups taken + in flight <= (max_staleness + v + 1)
x G, G groups a step, and never past the run's last step; so every group is launched at most
max_staleness versions before the step its index belongs to. A step takes G completed groups, the
earliest launched first (clawjax.train.groups.GroupRunner): a straggler moves to a later step instead of
holding this one, but only as long as the steps ahead can still take it, and every group launched
before it, within max_staleness versions of its launch; then the step waits for it. So no group is
trained past the bound, whatever max_staleness: a group launched at version L is trained by version
L + max_staleness, and its calls, sampled at L or later, are at most that many versions old. A group is
still dropped when a call of it is more than max_staleness versions behind the learner (its oldest
call: an engine replica that missed a push) or has no version (its age cannot be bounded), and when it
passed its deadline (`rollout.group_deadline_s`, clawjax.run.deadline: so no step waits for a hung
group for ever); a dropped group keeps its place in the count (the data order stays the cursor). A step with nothing to train (on
any process) runs its groups again, up to `empty_step_retries` times, as the synchronous loop does; it
keeps its step number, and the groups any attempt dropped are recorded with it (also those that a later
attempt, sampling them again, trained).

The checkpoint's cursor lists the groups launched and not trained, and the next step to sample; a
resumed run runs those groups again, so no group is trained twice. In a multi-process run each process
runs its own groups (clawjax.train.layout) and takes its share of each step (none, when G is smaller
than the number of processes and it owns no group of the step).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from clawjax import distributed
from clawjax.run.deadline import Timer
from clawjax.train.groups import CompletedGroup, Group, GroupRunner
from clawjax.train.step_data import StepData, build_step, call_staleness, failure_reasons, has_data
from clawjax.train.steps import Run, StepTrainer

log = logging.getLogger(__name__)


class GroupedRun(Run):
  """A run that names its groups (clawjax.train.trainer.Trainer)."""

  def group(self, index: int) -> Group: ...

  def owns(self, group: Group) -> bool: ...

  def own_groups(self, step: int) -> list[Group]: ...


def run_async(trainer: GroupedRun, steps: StepTrainer, start: int,
              timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer) -> None:
  """`timer`: what times the groups' deadlines (threading.Timer; a simulated clock's in tests)."""
  cfg, layout = trainer.cfg, trainer.layout
  runner = GroupRunner(steps.session, cfg.rollouts_per_task, cfg.concurrency, layout.groups_dir,
                       cfg.rollout.group_deadline(), timer)
  pending = [trainer.group(i) for i in steps.cursor.get("pending", []) if trainer.owns(trainer.group(i))]
  next_step = int(steps.cursor.get("next_step", start + 1))
  try:
    for group in pending:
      runner.launch(group, steps.session.version)
    for step in range(start + 1, cfg.steps + 1):
      version = steps.session.version
      # Admission: the groups of the steps up to max_staleness ahead of the one being trained, that is
      # taken + in flight <= (max_staleness + version + 1) x G.
      while next_step <= min(version + 1 + cfg.batch.max_staleness, cfg.steps):
        for group in trainer.own_groups(next_step):
          runner.launch(group, version)
          pending.append(group)
        next_step += 1
      t0 = time.time()
      taken, split, data = _step_groups(trainer, runner, step, version, steps.vocab_size)
      wait_s = time.time() - t0
      taken_ids = {c.group.index for c in taken}
      pending = [g for g in pending if g.index not in taken_ids]
      _write_groups(trainer, step, split)
      extra = {"rollouts": float(len(taken) * cfg.rollouts_per_task), "rollout_s": wait_s,
               "groups/taken": float(len(taken)), "groups/dropped_stale": float(len(split.stale)),
               "groups/dropped_overdue": float(len(split.overdue)),
               "calls_without_version": float(split.unversioned_calls),
               "groups/in_flight": float(len(runner.in_flight)),
               # Older groups still running while younger ones train: stragglers that moved on.
               "groups/deferred": float(sum(g.index < max(taken_ids, default=-1) for g in runner.in_flight))}
      if taken:
        extra["group_wall_s"] = float(np.median([c.wall_s for c in taken]))
      # Every process's pending groups, so that a resume of any process finds its own.
      all_pending = sorted(i for part in distributed.allgather_json([g.index for g in pending]) for i in part)
      steps.cursor.update(pending=all_pending, next_step=next_step)
      steps.train(step, data, extra, data_path=layout.groups_dir)
  finally:
    runner.close()


@dataclasses.dataclass
class Freshness:
  """The taken groups split by the staleness bound; those past their deadline apart."""
  fresh: list[CompletedGroup]
  stale: list[CompletedGroup]
  unversioned_calls: int  # sampled calls without a policy version (they make their group stale)
  overdue: list[CompletedGroup] = dataclasses.field(default_factory=list)  # given up (never trained)


def _step_groups(trainer: GroupedRun, runner: GroupRunner, step: int, version: int, vocab_size: int
                 ) -> tuple[list[CompletedGroup], Freshness, StepData]:
  """(taken, taken split by staleness, the step's data) of this process: the step's share of completed
  groups. When no process has anything to train in them, they run again (a retry keeps the step's
  number), up to `empty_step_retries` times; the split holds the last attempt's trained groups and every
  attempt's dropped ones."""
  cfg = trainer.cfg
  bound = cfg.batch.max_staleness
  n = len(trainer.own_groups(step))
  later = [len(trainer.own_groups(s)) if s <= cfg.steps else 0 for s in range(step + 1, step + 1 + bound)]
  dropped = Freshness([], [], 0)  # over every attempt
  for attempt in range(cfg.empty_step_retries + 1):
    taken = runner.take(n, due=version - bound, later=later)
    split = _fresh_groups(trainer, taken, version)
    dropped.stale += split.stale
    dropped.unversioned_calls += split.unversioned_calls
    dropped.overdue += split.overdue
    # (An overdue group is loaded for its records, which build_step leaves out and counts.)
    loaded = trainer.layout.load([c.path for c in split.fresh + split.overdue])
    data = build_step(loaded, policy_version=version, vocab_size=vocab_size, filters=cfg.filters, batch=cfg.batch)
    if has_data(data, step):
      return taken, Freshness(split.fresh, dropped.stale, dropped.unversioned_calls, dropped.overdue), data
    reasons = (failure_reasons(loaded) or [f"exclusions {data.counts}"]) + (
        [f"{len(split.stale)} groups dropped as stale"] if split.stale else [])
    log.warning("step %d: nothing to train in %d groups (attempt %d of %d): %s", step, n, attempt + 1,
                cfg.empty_step_retries + 1, " | ".join(reasons))
    if attempt < cfg.empty_step_retries:
      for c in taken:  # the same groups again, sampled now
        runner.launch(c.group, version)
  raise RuntimeError(f"step {step}: nothing to train in {cfg.empty_step_retries + 1} attempts (see "
                     f"{trainer.layout.groups_dir}); why: {' | '.join(reasons)}")


def _write_groups(trainer: GroupedRun, step: int, split: Freshness) -> None:
  """steps/step_<k>/groups.json: the groups the step trained and those any of its attempts dropped as
  stale or as overdue."""
  record = trainer.workdir / "steps" / f"step_{step}" / trainer.layout.per_process("groups.json")
  record.parent.mkdir(parents=True, exist_ok=True)
  record.write_text(json.dumps({"trained": [c.group.key for c in split.fresh],
                                "dropped_stale": [c.group.key for c in split.stale],
                                "dropped_overdue": [c.group.key for c in split.overdue]}) + "\n")


def _fresh_groups(trainer: GroupedRun, taken: list[CompletedGroup], version: int) -> Freshness:
  """A group is as old as its oldest call, and a call without a policy version is taken as too old (its
  age cannot be bounded)."""
  bound = trainer.cfg.batch.max_staleness
  out = Freshness([], [], 0)
  for c in taken:
    if c.overdue:
      log.info("group %s (%s, %s) dropped: past its deadline of %g s (rollout.group_deadline_s)", c.group.key,
               c.group.task.task_id, c.group.harness, trainer.cfg.rollout.group_deadline())
      out.overdue.append(c)
      continue
    calls = [call for rollout in trainer.layout.load([c.path]).calls.values() for call in rollout]
    out.unversioned_calls += sum(call.status == "ok" and call.policy_version is None for call in calls)
    (out.stale if call_staleness(calls, version) > bound else out.fresh).append(c)
  for c in out.stale:
    log.info("group %s (%s, %s) dropped: a call sampled more than %d versions ago, or by no known version",
             c.group.key, c.group.task.task_id, c.group.harness, bound)
  return out
