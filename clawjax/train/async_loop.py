"""Asynchronous RL (`config.async_rl`): rollouts run while the learner updates.

Up to `batch.max_staleness` steps' groups are in flight ahead of the step being trained; a step trains on
the first groups to complete (so a straggler moves to a later step instead of holding this one), and a
group whose oldest call is more than `batch.max_staleness` versions behind is dropped, never trained.
The checkpoint's cursor lists the groups launched and not trained, and the next step to sample; a
resumed run runs those groups again, so no group is trained twice. In a multi-process run each process
runs its own groups (clawjax.train.layout) and takes its share of each step.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from clawjax import distributed
from clawjax.train.groups import CompletedGroup, Group, GroupRunner
from clawjax.train.step_data import build_step, failure_reasons
from clawjax.train.steps import Run, StepTrainer

log = logging.getLogger(__name__)


class GroupedRun(Run):
  """A run that names its groups (clawjax.train.trainer.Trainer)."""

  def group(self, index: int) -> Group: ...

  def owns(self, group: Group) -> bool: ...

  def own_groups(self, step: int) -> list[Group]: ...


def run_async(trainer: GroupedRun, steps: StepTrainer, start: int) -> None:
  cfg, layout = trainer.cfg, trainer.layout
  runner = GroupRunner(steps.session, cfg.rollouts_per_task, cfg.concurrency, layout.groups_dir)
  pending = [trainer.group(i) for i in steps.cursor.get("pending", []) if trainer.owns(trainer.group(i))]
  next_step = int(steps.cursor.get("next_step", start + 1))
  try:
    for group in pending:
      runner.launch(group)
    empty = 0
    for step in range(start + 1, cfg.steps + 1):
      while next_step <= step + cfg.batch.max_staleness:  # the groups of up to max_staleness steps ahead
        for group in trainer.own_groups(next_step):
          runner.launch(group)
          pending.append(group)
        next_step += 1
      per_step = len(trainer.own_groups(step))
      t0 = time.time()
      taken = runner.take(per_step)
      wait_s = time.time() - t0
      trained = {c.group.index for c in taken}
      pending = [g for g in pending if g.index not in trained]
      fresh, dropped = _fresh_groups(trainer, taken, steps.session.version)
      loaded = layout.load([c.path for c in fresh])
      data = build_step(loaded, policy_version=steps.session.version, filters=cfg.filters, batch=cfg.batch)
      trainable = sum(distributed.allgather_json(data.tree_stats["trained_rollouts"]))
      if not trainable:
        empty += 1
        reasons = failure_reasons(loaded) or [f"exclusions {data.counts}"]
        log.warning("step %d: nothing to train in %d groups: %s", step, len(taken), " | ".join(reasons))
        if empty > cfg.empty_step_retries:
          raise RuntimeError(f"step {step}: nothing to train in {empty} batches of groups in a row (see "
                             f"{layout.groups_dir}); why: {' | '.join(reasons)}")
        continue
      empty = 0
      record = trainer.workdir / "steps" / f"step_{step}" / layout.per_process("groups.json")
      record.parent.mkdir(parents=True, exist_ok=True)
      record.write_text(json.dumps({"trained": [c.group.key for c in fresh],
                                    "dropped_stale": [c.group.key for c in dropped]}) + "\n")
      newest = max(trained)
      extra = {"rollouts": float(per_step * cfg.rollouts_per_task), "rollout_s": wait_s,
               "groups/taken": float(len(taken)), "groups/dropped_stale": float(len(dropped)),
               "groups/in_flight": float(len(runner.in_flight)),
               # Older groups still running while younger ones train: stragglers that moved on.
               "groups/deferred": float(sum(g.index < newest for g in runner.in_flight)),
               "group_wall_s": float(np.median([c.wall_s for c in taken]))}
      # Every process's pending groups, so that a resume of any process finds its own.
      all_pending = sorted(i for part in distributed.allgather_json([g.index for g in pending]) for i in part)
      steps.cursor.update(pending=all_pending, next_step=next_step)
      steps.train(step, data, extra, data_path=layout.groups_dir)
  finally:
    runner.close()


def _fresh_groups(trainer: GroupedRun, taken: list[CompletedGroup], version: int
                  ) -> tuple[list[CompletedGroup], list[CompletedGroup]]:
  """(groups within the staleness bound, groups too old to train): a group is as old as its oldest call."""
  bound = trainer.cfg.batch.max_staleness
  fresh, stale = [], []
  for c in taken:
    loaded = trainer.layout.load([c.path])
    versions = [call.policy_version for calls in loaded.calls.values() for call in calls
                if call.status == "ok" and call.policy_version is not None]
    (stale if versions and version - min(versions) > bound else fresh).append(c)
  for c in stale:
    log.info("group %s (%s, %s) dropped: sampled more than %d versions ago", c.group.key, c.group.task.task_id,
             c.group.harness, bound)
  return fresh, stale
