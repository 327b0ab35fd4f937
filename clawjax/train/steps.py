"""What every RL step does with its data, synchronous or not, in one process or many: the learner update,
the guards, the weight push, the checkpoint with the data cursor, the metrics and the periodic
evaluation.

In a multi-process run every process calls `StepTrainer.train` once per step with the data of its own
groups: the update is one global step over all processes' rows (clawjax.rl.learner: `prepare_all`),
the checkpoint is written by all (each its shards), and the step's metrics are gathered from every
process and written once, by process 0.
"""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any, Protocol

import jax
import numpy as np

from clawjax import distributed, progress
from clawjax.models.model import Decoder
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.run.session import PolicySession, PolicyUpdateError
from clawjax.train.config import TrainConfig
from clawjax.train.failing_harness import FailingHarnesses, HarnessFailedError
from clawjax.train.layout import RunLayout
from clawjax.train.learner_view import write_learner_view
from clawjax.train.metrics import MetricsWriter
from clawjax.train.step_data import StepData, step_metrics, summary
from clawjax.tree.batch import ADVANTAGES_FILE, LEARNER_FILE

log = logging.getLogger(__name__)


class Run(Protocol):
  """What a step needs of its run (clawjax.train.trainer.Trainer)."""
  cfg: TrainConfig
  workdir: pathlib.Path
  layout: RunLayout
  ckpt: Checkpointer
  metrics: MetricsWriter

  def engine_policy(self, learner: Learner) -> Decoder: ...

  def evaluate(self, session: PolicySession, step: int) -> None: ...


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
  keys = sorted({k for r in rows for k in r})
  return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


# How a value each process reports for the step combines: the step waits for its slowest process; counts
# add up.
_SLOWEST = ("rollout_s", "replayed", "group_wall_s")


def _merge_extra(extras: list[dict[str, float]]) -> dict[str, float]:
  keys = sorted({k for e in extras for k in e})
  return {k: float((max if k in _SLOWEST else sum)(e[k] for e in extras if k in e)) for k in keys}


def update(learner: Learner, data: StepData, value_pretrain_steps: int) -> dict[str, float]:
  """The step's optimizer updates, one per packed batch (as many on every process: `prepare_all` pads
  a process that has fewer), after `value_pretrain_steps` critic-only updates. pi_old (and V_old) is the
  policy the step starts from, for every batch: all are computed before the first update, so a later
  batch's ratio pi / pi_old is measured from there and clipped (as verl, slime and AReaL do)."""
  prepared = learner.prepare_all(data.batches)
  out: dict[str, float] = {}
  if value_pretrain_steps:
    rows = [learner.pretrain_value_step(prepared[i % len(prepared)]) for i in range(value_pretrain_steps)]
    out.update({f"value_pretrain/{k}": v for k, v in rows[-1].items()})
  olds = jax.block_until_ready([learner.old_pass(b) for b in prepared])
  steps = [learner.step(b, old) for b, old in zip(prepared, olds)]
  out.update(_mean(steps))
  for key in ("updates", "skipped_updates"):
    out[key] = float(sum(m[key] for m in steps))
  return out


class StepTrainer:

  def __init__(self, trainer: Run, session: PolicySession, learner: Learner, cursor: dict[str, Any]):
    self.trainer, self.session, self.learner, self.cursor = trainer, session, learner, cursor
    self.vocab_size: int = learner.policy_model().cfg.vocab_size  # the ids a step's data may hold
    self.skipped_steps = 0
    self.failing_harnesses = FailingHarnesses(trainer.cfg.failing_harness_steps)
    self.clock = progress.StepClock(trainer.cfg.steps)

  def train(self, step: int, data: StepData, extra: dict[str, float], data_path) -> None:
    trainer, cfg, learner = self.trainer, self.trainer.cfg, self.learner
    step_dir = trainer.workdir / "steps" / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / trainer.layout.per_process(ADVANTAGES_FILE)).write_text(json.dumps(data.scores.by_rollout()) + "\n")
    if step == cfg.steps and distributed.process_count() == 1:
      # The step the report shows: its pi_old is the policy before this update. (Forward passes of one
      # process's own rollouts would not be collectives every process makes: one process only.)
      write_learner_view(step_dir / LEARNER_FILE, learner.policy_model(), data.rewards, trainer.layout.calls_dir,
                         cfg.learner, cfg.filters)
    t1 = time.time()
    with progress.phase(f"step {step}/{cfg.steps}: learner update ({len(data.batches)} batches)"):
      pretrain = 0 if self.cursor["value_pretrained"] else cfg.value_pretrain_steps
      m = update(learner, data, pretrain)
    self.cursor["value_pretrained"] = True
    learner_s = time.time() - t1
    # The learner's metrics are global (every process has the same): decisions on them agree.
    self.skipped_steps = self.skipped_steps + 1 if m["skipped_updates"] else 0
    if self.skipped_steps >= cfg.max_skipped_steps:
      raise RuntimeError(
          f"step {step}: {self.skipped_steps} steps in a row had an update with a non-finite loss or gradient "
          f"(skipped; the parameters were kept). Inspect this step's data: {data_path} and its calls in "
          f"{trainer.layout.calls_dir}")
    self.cursor["step"] = step
    parts = distributed.allgather_json({**summary(data), "extra": extra})
    failing = self.failing_harnesses.check(parts, step)
    m.update(step_metrics(parts))
    m.update(_merge_extra([p["extra"] for p in parts]))
    m.update({"learner_s": learner_s, "num_processes": float(len(parts))})
    t2 = time.time()
    # The push comes before the checkpoint, so that rollouts in flight sample the new weights as soon as
    # they exist. A crash between the two loses this step, which a resume redoes from its logged data,
    # first pushing the checkpoint's lower version to the engine that holds this one (PolicySession).
    try:
      self.session.push(trainer.engine_policy(learner), step)
    except PolicyUpdateError:
      # The step was trained: keep it and its metrics (without a push), so a resume goes on after it.
      trainer.ckpt.save(learner.state, cursor=self.cursor)
      trainer.metrics.write("rl", step, m)
      raise
    m.update({"push_s": time.time() - t2, "policy_version": float(self.session.version)})
    if step % cfg.checkpoint_every == 0 or step == cfg.steps or failing:
      trainer.ckpt.save(learner.state, cursor=self.cursor)
    trainer.metrics.write("rl", step, m)
    failures = [f for p in parts for f in p["failures"]]
    log.info("step %d/%d: reward %.3f (%d/%d ok), rollouts %.0f s, learner %.1f s, %s%s", step, cfg.steps,
             m.get("reward/mean", float("nan")), int(m["rollouts_ok"]), int(m["rollouts"]),
             m["rollout_s"], learner_s, self.clock.tick(step),
             "; failures: " + " | ".join(failures) if failures else "")
    if failing:
      raise HarnessFailedError(failing)
    if cfg.eval_every and step % cfg.eval_every == 0 and distributed.is_primary():
      trainer.evaluate(self.session, step)
