"""The synchronous RL loop (the paper's recipe): a step's rollouts all run on the weights of the previous
update, then the learner trains on them.

Per step: this process's groups of the step's task sample run through the policy session into
steps/step_<k>/rollouts.jsonl (a crashed run that logged all of them is replayed from the file); with
dynamic sampling (clawjax.train.dynamic_sampling) further draws of the step run into
rollouts_draw<d>.jsonl until enough groups carry a signal; the step's data is built from every draw. A
step with nothing to train (on any process) runs again, up to `empty_step_retries` times, then the run
stops with the failures' reasons.
"""

from __future__ import annotations

import logging
import pathlib
import time
from typing import Protocol

from clawjax.calllog import CallLogWriter, RolloutRecord, iter_records
from clawjax.run.session import PolicySession
from clawjax.train.dynamic_sampling import draw_again, sampling_metrics
from clawjax.train.groups import Group
from clawjax.train.layout import RunLayout
from clawjax.train.config import TrainConfig
from clawjax.train.step_data import StepData, build_step, failure_reasons, has_data
from clawjax.train.steps import StepTrainer

log = logging.getLogger(__name__)


class SyncRun(Protocol):
  """What the loop needs of its run (clawjax.train.trainer.Trainer)."""
  cfg: TrainConfig
  layout: RunLayout

  def own_groups(self, step: int, draw: int = 0) -> list[Group]: ...


def replayable(path: pathlib.Path, n_jobs: int) -> bool:
  """Whether a crashed run left all of this draw's rollout records (then they are reused)."""
  if not path.exists():
    return False
  try:
    return sum(isinstance(r, RolloutRecord) for r in iter_records(path)) == n_jobs
  except ValueError:
    return False


def set_aside(path: pathlib.Path) -> None:
  """Keeps what a crash interrupted, under a new name, so the redo starts clean."""
  if path.exists():
    path.rename(path.with_name(f"{path.name}.partial-{int(time.time())}"))


def run_sync(run: SyncRun, steps: StepTrainer, start: int) -> None:
  for step in range(start + 1, run.cfg.steps + 1):
    t0 = time.time()
    jobs, data, replayed, sampling = _step_data(run, steps.session, step, steps.vocab_size)
    steps.train(step, data, {"rollouts": float(jobs), "rollout_s": time.time() - t0, "replayed": float(replayed),
                             **sampling}, data_path=run.layout.rollouts_file(step))


def _rollouts(run: SyncRun, session: PolicySession, step: int, draw: int, again: bool
              ) -> tuple[int, pathlib.Path, bool]:
  """Runs this process's rollouts of the step's draw (or, unless `again`, finds them all logged by a run
  that crashed after them); (their number, their file, whether replayed)."""
  jobs = [job for g in run.own_groups(step, draw) for job in g.jobs(run.cfg.rollouts_per_task)]
  path = run.layout.rollouts_file(step, draw)
  replayed = not again and replayable(path, len(jobs))
  if not replayed:
    set_aside(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with CallLogWriter(path) as writer:
      session.run(jobs, writer, label=f"s{step}" if draw == 0 else f"s{step}d{draw}",
                  desc=f"step {step}/{run.cfg.steps}" + (f" draw {draw + 1}" if draw else ""),
                  group_deadline_s=run.cfg.rollout.group_deadline())
  return len(jobs), path, replayed


def _step_data(run: SyncRun, session: PolicySession, step: int, vocab_size: int
               ) -> tuple[int, StepData, bool, dict[str, float]]:
  """The step's rollouts (of every draw) as training data for a model of `vocab_size` tokens: (rollouts
  run, the data, whether the first draw was replayed, the sampling metrics)."""
  cfg = run.cfg
  for attempt in range(cfg.empty_step_retries + 1):
    n_jobs, path, replayed = _rollouts(run, session, step, 0, again=attempt > 0)
    paths, draws = [path], 1
    loaded = run.layout.load(paths)
    data = build_step(loaded, policy_version=session.version, vocab_size=vocab_size, filters=cfg.filters,
                      batch=cfg.batch)
    while draw_again(cfg.batch, data, draws):
      n, path, _ = _rollouts(run, session, step, draws, again=attempt > 0)
      n_jobs, draws = n_jobs + n, draws + 1
      paths.append(path)
      loaded = run.layout.load(paths)
      data = build_step(loaded, policy_version=session.version, vocab_size=vocab_size, filters=cfg.filters,
                        batch=cfg.batch)
    if has_data(data, step):
      groups = sum(len(run.own_groups(step, d)) for d in range(draws))
      return n_jobs, data, replayed, sampling_metrics(cfg.batch, data, draws, groups, len(cfg.harnesses))
    reasons = failure_reasons(loaded) or [f"exclusions {data.counts}"]
    log.warning("step %d: no trainable rollout among %d (attempt %d of %d): %s", step, n_jobs,
                attempt + 1, cfg.empty_step_retries + 1, " | ".join(reasons))
  raise RuntimeError(f"step {step}: no trainable rollout in {cfg.empty_step_retries + 1} attempts of "
                     f"{n_jobs} rollouts (see {path.parent}); why: {' | '.join(reasons)}")
