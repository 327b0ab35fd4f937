"""The RL loop: black-box RL of the model behind an unmodified harness (ClawGym II), one step at a time.

  train(config, workdir) -> summary dict

Per step k: sample tasks (a fixed function of (seed, k), so a resumed run sees the same data order)
-> for each (task, harness) `rollouts_per_task` rollouts through the shim, `concurrency` at a time
(clawjax.run.session) -> settle, score (clawjax.harness.rollout) -> filter and build trees, GRPO
advantages per (task, harness) group (step_data.py) -> learner updates over tree-packed batches with TIS
(pi_old recomputed inside the step) -> push the weights to the engine -> Orbax checkpoint -> metrics
-> periodic held-out evaluation.

WORKDIR layout: calls/<rollout_id>.jsonl (the shim's call logs), steps/step_<k>/rollouts.jsonl (rollout
records), checkpoints/ (Orbax; the cursor holds the RL step), metrics.jsonl + tb/ (metrics.py),
sft/ (cold-start demonstrations), config.json, environment.json (clawjax/environment.py), *.png. Rerunning the same command resumes from the
last checkpoint (the config must match config.json, see config.py); a step whose rollouts all
finished before a crash is replayed from its logs.

Weight push: embedded engine in place (`Engine.update_from_model`, new policy version); sglang / vllm:
safetensors export + the backend's `update_weights_from_disk` + `flush_cache`. Rollouts of a step run
entirely on the weights of the previous update (the loop is synchronous), so every call's recorded
policy version is current; `batch.max_staleness` still guards against an engine that lags.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from clawjax import config as config_lib
from clawjax import progress, sharding
from clawjax.calllog import CallLogWriter, LoadedLog, RolloutRecord, iter_records, load
from clawjax.models.loading import load_model
from clawjax.models.model import Decoder
from clawjax.report.run import write_report
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from clawjax.run.session import PolicySession, PolicyUpdateError, RolloutJob
from clawjax.run.start import start_run
from clawjax.tasks import Task, select_tasks
from clawjax.train.cold_start import record_demos, run_sft
from clawjax.train.config import TrainConfig, check_resume
from clawjax.train.groups import CompletedGroup, Group, GroupRunner, groups_per_step, step_groups
from clawjax.train.metrics import MetricsWriter, read_metrics
from clawjax.train.step_data import StepData, build_step, failure_reasons, reward_metrics
from clawjax.train.learner_view import write_learner_view
from clawjax.tree.batch import ADVANTAGES_FILE, LEARNER_FILE

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


def _groups(cfg: TrainConfig, tasks: list[Task], step: int) -> list[Group]:
  return step_groups(cfg.seed, cfg.tasks_per_step, cfg.harnesses, tasks, step)


def step_jobs(cfg: TrainConfig, tasks: list[Task], step: int) -> list[RolloutJob]:
  """The step's rollouts: a function of (seed, step) only, so resuming replays it."""
  return [job for g in _groups(cfg, tasks, step) for job in g.jobs(cfg.rollouts_per_task)]


def load_step_log(workdir: pathlib.Path, rollout_files: pathlib.Path | Sequence[pathlib.Path]) -> LoadedLog:
  """The rollout records of `rollout_files` and the shim's call logs of those rollouts."""
  rollout_files = [rollout_files] if isinstance(rollout_files, pathlib.Path) else list(rollout_files)
  records = [r for f in rollout_files for r in iter_records(f) if isinstance(r, RolloutRecord)]
  calls = [p for r in records if (p := workdir / "calls" / f"{r.rollout_id}.jsonl").exists()]
  return load(rollout_files + calls, errors="collect")


def _replayable(path: pathlib.Path, n_jobs: int) -> bool:
  """Whether a crashed run left all of this step's rollout records (then they are reused)."""
  if not path.exists():
    return False
  try:
    return sum(isinstance(r, RolloutRecord) for r in iter_records(path)) == n_jobs
  except ValueError:
    return False


def _mean(rows: list[dict[str, float]]) -> dict[str, float]:
  keys = sorted({k for r in rows for k in r})
  return {k: float(np.mean([r[k] for r in rows if k in r])) for k in keys}


def _set_aside(path: pathlib.Path) -> None:
  """Keeps what a crash interrupted, under a new name, so the redo starts clean."""
  if path.exists():
    path.rename(path.with_name(f"{path.name}.partial-{int(time.time())}"))


class Trainer:
  """Holds a run's learner, policy session and writers; `run()` trains to `cfg.steps`."""

  def __init__(self, cfg: TrainConfig, workdir: str | pathlib.Path):
    self.cfg, self.workdir = cfg, pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._pin_config()
    self.isolation = start_run(cfg.rollout, self.workdir, cfg.harnesses)
    self.tasks = select_tasks(cfg.tasks, cfg.task_ids)
    self.eval_tasks = select_tasks(cfg.eval_tasks) if cfg.eval_tasks else []
    self.metrics = MetricsWriter(self.workdir, cfg.tensorboard)
    self.ckpt = Checkpointer(self.workdir / "checkpoints", cfg.keep_checkpoints)
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert]
    devices = jax.devices() if -1 in sizes else jax.devices()[:math.prod(sizes)]
    self.mesh = sharding.make_mesh(cfg.mesh, devices)

  def _pin_config(self) -> None:
    """Writes config.json; a resume (a checkpoint exists) must match the config it started with."""
    path = self.workdir / CONFIG_FILE
    if path.exists() and (self.workdir / "checkpoints").exists():
      check_resume(json.loads(path.read_text()), self.cfg)
    path.write_text(json.dumps(config_lib.to_json(self.cfg), indent=2) + "\n")

  def _learner(self, policy: Decoder) -> Learner:
    cfg = self.cfg
    value = None
    if cfg.learner.value.kind != "none":
      trunk = nnx.clone(policy) if cfg.learner.value.kind == "separate" else None
      value = make_value_model(cfg.learner.value.kind, policy.cfg.d_model, trunk)
    return Learner(cfg.learner, policy, value=value, mesh=self.mesh)

  def _cold_start(self, policy: Decoder) -> Decoder:
    cfg = self.cfg
    out = self.workdir / "sft"
    _set_aside(out)  # demonstrations of an SFT stage a crash interrupted: record afresh
    out.mkdir()
    start = time.time()
    trees, scores = record_demos(cfg, self.tasks, out)
    self.metrics.truncate("sft", 1)
    policy = run_sft(policy, trees, scores, cfg.sft, cfg.learner, self.metrics, cfg.seed)
    log.info("cold-start SFT: %d steps on %d demonstrations in %.0f s", cfg.sft.steps, len(trees),
             time.time() - start)
    return policy

  def _update(self, learner: Learner, data: StepData, pretrain_value: bool) -> dict[str, float]:
    prepared = [learner.prepare(b) for b in data.batches]
    out: dict[str, float] = {}
    if pretrain_value:
      rows = [learner.pretrain_value_step(prepared[i % len(prepared)]) for i in range(self.cfg.value_pretrain_steps)]
      out.update({f"value_pretrain/{k}": v for k, v in rows[-1].items()})
    steps = [learner.step(b) for b in prepared]
    out.update(_mean(steps))
    for key in ("updates", "skipped_updates"):
      out[key] = float(sum(m[key] for m in steps))
    return out

  def _evaluate(self, session: PolicySession, step: int) -> None:
    cfg = self.cfg
    jobs = [RolloutJob(t, h, k) for t in self.eval_tasks for h in cfg.harnesses for k in range(cfg.eval_samples)]
    path = self.workdir / "eval" / f"step_{step}.jsonl"
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with CallLogWriter(path) as writer:
      records = [o.record for o in session.run(jobs, writer, label=f"e{step}", desc=f"eval {step}")]
    rewards = [r.reward if r.status == "ok" and r.reward is not None else 0.0 for r in records]
    self.metrics.write("eval", step, {"reward/mean": float(np.mean(rewards)),
                                      "ok_fraction": float(np.mean([r.status == "ok" for r in records]))})

  def _rollouts(self, session: PolicySession, step: int, again: bool
                ) -> tuple[list[RolloutJob], pathlib.Path, bool]:
    """Runs the step's rollouts (or, unless `again`, finds them all logged by a run that crashed after
    them)."""
    jobs = step_jobs(self.cfg, self.tasks, step)
    path = self.workdir / "steps" / f"step_{step}" / "rollouts.jsonl"
    replayed = not again and _replayable(path, len(jobs))
    if not replayed:
      _set_aside(path)
      path.parent.mkdir(parents=True, exist_ok=True)
      with CallLogWriter(path) as writer:
        session.run(jobs, writer, label=f"s{step}", desc=f"step {step}/{self.cfg.steps}")
    return jobs, path, replayed

  def _step_data(self, session: PolicySession, step: int) -> tuple[list[RolloutJob], StepData, bool]:
    """The step's rollouts as training data; a step with nothing to train is run again up to
    `empty_step_retries` times, then the run stops with the failures' reasons."""
    cfg = self.cfg
    for attempt in range(cfg.empty_step_retries + 1):
      jobs, path, replayed = self._rollouts(session, step, again=attempt > 0)
      loaded = load_step_log(self.workdir, path)
      data = build_step(loaded, policy_version=session.version, filters=cfg.filters, batch=cfg.batch)
      if data.tree_stats["trained_rollouts"]:
        return jobs, data, replayed
      reasons = failure_reasons(loaded) or [f"exclusions {data.counts}"]
      log.warning("step %d: no trainable rollout among %d (attempt %d of %d): %s", step, len(jobs),
                  attempt + 1, cfg.empty_step_retries + 1, " | ".join(reasons))
    raise RuntimeError(f"step {step}: no trainable rollout in {cfg.empty_step_retries + 1} attempts of "
                       f"{len(jobs)} rollouts (see {path.parent}); why: {' | '.join(reasons)}")

  def run(self) -> dict[str, Any]:
    cfg = self.cfg
    t_run = time.time()
    resume = self.ckpt.latest_step()
    model = cfg.model
    with progress.phase(f"model: load {model.init}"):
      policy = load_model(model.init, seed=cfg.seed, mesh=self.mesh, random_init=model.random_init,
                          **model.overrides).model
    if resume is None and cfg.sft.steps:
      with progress.phase(f"cold-start SFT ({cfg.sft.steps} steps)"):
        policy = self._cold_start(policy)
    with progress.phase("learner: build" + (f" and restore checkpoint {resume}" if resume is not None else "")):
      learner = self._learner(policy)
      cursor: dict[str, Any] = {"step": 0, "value_pretrained": cfg.value_pretrain_steps == 0}
      if resume is not None:
        learner.state, cursor = self.ckpt.restore(learner.state)
    if resume is not None:
      log.info("resuming after RL step %d (checkpoint %d)", cursor["step"], resume)
    start = int(cursor["step"])
    self.metrics.truncate("rl", start + 1)
    self.metrics.truncate("eval", start + 1)
    with PolicySession(cfg, self.workdir / "calls", policy=learner.policy_copy(), version=start, seed=cfg.seed,
                       workdir=self.workdir) as session:
      if session.engine is None and (resume is not None or cfg.sft.steps):
        # A remote engine serves model.init (or what it last loaded): give it the learner's weights, so
        # that the first step samples from pi_old and not from another policy.
        session.push(learner.policy_copy(), start)
      steps = _StepTrainer(self, session, learner, cursor)
      (self._async_loop if cfg.async_rl else self._sync_loop)(steps, start)
    self.metrics.close()
    summary = summarize(self.workdir)
    summary["wall_s"] = round(time.time() - t_run, 1)
    summary["isolation"] = self.isolation
    (self.workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.plot:
      from clawjax.train.plots import plot_run  # pylint: disable=import-outside-toplevel  (matplotlib)
      plot_run(self.workdir)
    write_report(self.workdir)
    return summary

  def _sync_loop(self, steps: "_StepTrainer", start: int) -> None:
    """The paper's recipe: a step's rollouts all run on the weights of the previous update."""
    for step in range(start + 1, self.cfg.steps + 1):
      t0 = time.time()
      jobs, data, replayed = self._step_data(steps.session, step)
      steps.train(step, data, {"rollouts": float(len(jobs)), "rollout_s": time.time() - t0,
                               "replayed": float(replayed)},
                  data_path=self.workdir / "steps" / f"step_{step}" / "rollouts.jsonl")

  def _async_loop(self, steps: "_StepTrainer", start: int) -> None:
    """Rollouts run while the learner updates: up to `batch.max_staleness` steps' groups are in flight
    ahead of the one being trained; a step trains on the first groups to complete (so a straggler moves
    to a later step), and a group whose calls are more than `batch.max_staleness` versions old is
    dropped, never trained. The checkpoint's cursor lists the groups launched and not trained; a resumed
    run runs them again."""
    cfg = self.cfg
    per_step = groups_per_step(cfg.tasks_per_step, len(self.tasks), len(cfg.harnesses))
    runner = GroupRunner(steps.session, cfg.rollouts_per_task, cfg.concurrency, self.workdir / "groups")
    by_index = lambda i: _groups(cfg, self.tasks, i // per_step + 1)[i % per_step]
    pending = [by_index(i) for i in steps.cursor.get("pending", [])]
    next_step = int(steps.cursor.get("next_step", start + 1))
    try:
      for group in pending:
        runner.launch(group)
      empty = 0
      for step in range(start + 1, cfg.steps + 1):
        while len(pending) < (cfg.batch.max_staleness + 1) * per_step:  # keep the pipeline full
          for group in _groups(cfg, self.tasks, next_step):
            runner.launch(group)
            pending.append(group)
          next_step += 1
        t0 = time.time()
        taken = runner.take(per_step)
        wait_s = time.time() - t0
        trained = {c.group.index for c in taken}
        pending = [g for g in pending if g.index not in trained]
        fresh, dropped = self._fresh_groups(taken, steps.session.version)
        loaded = load_step_log(self.workdir, [c.path for c in fresh])
        data = build_step(loaded, policy_version=steps.session.version, filters=cfg.filters, batch=cfg.batch)
        newest = max(trained)
        extra = {"rollouts": float(per_step * cfg.rollouts_per_task), "rollout_s": wait_s,
                 "groups/taken": float(len(taken)), "groups/dropped_stale": float(len(dropped)),
                 "groups/in_flight": float(len(runner.in_flight)),
                 # Older groups still running while younger ones train: stragglers that moved on.
                 "groups/deferred": float(sum(g.index < newest for g in runner.in_flight)),
                 "group_wall_s": float(np.median([c.wall_s for c in taken]))}
        if not data.tree_stats["trained_rollouts"]:
          empty += 1
          reasons = failure_reasons(loaded) or [f"exclusions {data.counts}"]
          log.warning("step %d: nothing to train in %d groups: %s", step, len(taken), " | ".join(reasons))
          if empty > cfg.empty_step_retries:
            raise RuntimeError(f"step {step}: nothing to train in {empty} batches of groups in a row (see "
                               f"{self.workdir / 'groups'}); why: {' | '.join(reasons)}")
          continue
        empty = 0
        record = self.workdir / "steps" / f"step_{step}" / "groups.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"trained": [c.group.key for c in fresh],
                                      "dropped_stale": [c.group.key for c in dropped]}) + "\n")
        steps.cursor.update(pending=[g.index for g in pending], next_step=next_step)
        steps.train(step, data, extra, data_path=self.workdir / "groups")
    finally:
      runner.close()

  def _fresh_groups(self, taken: list[CompletedGroup], version: int
                    ) -> tuple[list[CompletedGroup], list[CompletedGroup]]:
    """(groups within the staleness bound, groups too old to train): a group is as old as its oldest call."""
    fresh, stale = [], []
    for c in taken:
      loaded = load_step_log(self.workdir, [c.path])
      versions = [call.policy_version for calls in loaded.calls.values() for call in calls
                  if call.status == "ok" and call.policy_version is not None]
      (stale if versions and version - min(versions) > self.cfg.batch.max_staleness else fresh).append(c)
    for c in stale:
      log.info("group %s (%s, %s) dropped: sampled more than %d versions ago", c.group.key, c.group.task.task_id,
               c.group.harness, self.cfg.batch.max_staleness)
    return fresh, stale


class _StepTrainer:
  """What every RL step does with its data, synchronous or not: the update, the guards, the checkpoint
  with the data cursor, the weight push, the metrics and the periodic evaluation."""

  def __init__(self, trainer: Trainer, session: PolicySession, learner: Learner, cursor: dict[str, Any]):
    self.trainer, self.session, self.learner, self.cursor = trainer, session, learner, cursor
    self.skipped_steps = 0
    self.clock = progress.StepClock(trainer.cfg.steps)

  def train(self, step: int, data: StepData, extra: dict[str, float], data_path: pathlib.Path) -> None:
    trainer, cfg, learner = self.trainer, self.trainer.cfg, self.learner
    step_dir = trainer.workdir / "steps" / f"step_{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / ADVANTAGES_FILE).write_text(json.dumps(data.scores.by_rollout()) + "\n")
    if step == cfg.steps:  # the step the report shows: its pi_old is the policy before this update
      write_learner_view(step_dir / LEARNER_FILE, learner.policy_model(), data.rewards, trainer.workdir / "calls",
                         cfg.learner, cfg.filters)
    t1 = time.time()
    with progress.phase(f"step {step}/{cfg.steps}: learner update ({len(data.batches)} batches)"):
      m = trainer._update(learner, data, pretrain_value=not self.cursor["value_pretrained"])
    self.cursor["value_pretrained"] = True
    learner_s = time.time() - t1
    self.skipped_steps = self.skipped_steps + 1 if m["skipped_updates"] else 0
    if self.skipped_steps >= cfg.max_skipped_steps:
      raise RuntimeError(
          f"step {step}: {self.skipped_steps} steps in a row had an update with a non-finite loss or gradient "
          f"(skipped; the parameters were kept). Inspect this step's data: {data_path} and its calls in "
          f"{trainer.workdir / 'calls'}")
    self.cursor["step"] = step
    t2 = time.time()
    try:
      self.session.push(learner.policy_copy(), step)
    except PolicyUpdateError:
      trainer.ckpt.save(learner.state, cursor=self.cursor)  # keep what was trained
      raise
    push_s = time.time() - t2
    if step % cfg.checkpoint_every == 0 or step == cfg.steps:
      trainer.ckpt.save(learner.state, cursor=self.cursor)
    n_ok = len(data.rewards)
    m.update(reward_metrics(data))
    m.update(data.tree_stats)
    m.update({f"count/{k}": float(v) for k, v in data.counts.items()})
    m.update({f"staleness/{k}": float(v) for k, v in data.staleness.items()})
    m.update(extra)
    m.update({"rollouts_ok": float(n_ok), "over_branching_rate": data.counts.get("over_branching", 0) / max(n_ok, 1),
              "learner_s": learner_s, "push_s": push_s, "policy_version": float(self.session.version)})
    trainer.metrics.write("rl", step, m)
    log.info("step %d/%d: reward %.3f (%d/%d ok), rollouts %.0f s, learner %.1f s, %s%s", step, cfg.steps,
             m.get("reward/mean", float("nan")), n_ok, int(m["rollouts"]), m["rollout_s"], learner_s,
             self.clock.tick(step), "; failures: " + " | ".join(data.failures) if data.failures else "")
    if cfg.eval_every and step % cfg.eval_every == 0:
      trainer._evaluate(self.session, step)


def summarize(workdir: str | pathlib.Path, window: int = 5) -> dict[str, Any]:
  """steps, and the mean reward of the first and last `window` RL steps (from metrics.jsonl)."""
  rows = sorted(read_metrics(workdir, "rl"), key=lambda r: r["step"])
  rewards = [r.get("reward/mean", 0.0) for r in rows]
  mean = lambda xs: round(float(np.mean(xs)), 4) if xs else None
  return {"steps": len(rows), f"reward_first{window}": mean(rewards[:window]),
          f"reward_last{window}": mean(rewards[-window:])}


def train(cfg: TrainConfig, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains (or resumes) in `workdir`; returns the summary (steps, reward_first5, reward_last5)."""
  return Trainer(cfg, workdir).run()
