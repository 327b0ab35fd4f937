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
from typing import Any

import jax
import numpy as np
from flax import nnx

from clawjax import config as config_lib
from clawjax import sharding
from clawjax.calllog import CallLogWriter, LoadedLog, RolloutRecord, iter_records, load
from clawjax.models.loading import load_model
from clawjax.models.model import Decoder
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from clawjax.run.session import PolicySession, PolicyUpdateError, RolloutJob
from clawjax.run.start import start_run
from clawjax.tasks import Task, select_tasks
from clawjax.train.cold_start import record_demos, run_sft
from clawjax.train.config import TrainConfig, check_resume
from clawjax.train.metrics import MetricsWriter, read_metrics
from clawjax.train.step_data import StepData, build_step, failure_reasons, reward_metrics

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


def step_jobs(cfg: TrainConfig, tasks: list[Task], step: int) -> list[RolloutJob]:
  """The step's rollouts: a function of (seed, step) only, so resuming replays it."""
  rng = np.random.default_rng([cfg.seed, step])
  order = rng.permutation(len(tasks))[:min(cfg.tasks_per_step, len(tasks))]
  return [RolloutJob(tasks[i], h, k) for i in order for h in cfg.harnesses for k in range(cfg.rollouts_per_task)]


def load_step_log(workdir: pathlib.Path, rollouts_file: pathlib.Path) -> LoadedLog:
  records = [r for r in iter_records(rollouts_file) if isinstance(r, RolloutRecord)]
  files = [rollouts_file] + [p for r in records if (p := workdir / "calls" / f"{r.rollout_id}.jsonl").exists()]
  return load(files, errors="collect")


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
    self.isolation = start_run(cfg.rollout, self.workdir)
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
    trees = record_demos(cfg, self.tasks, out)
    self.metrics.truncate("sft", 1)
    policy = run_sft(policy, trees, cfg.sft, cfg.learner, self.metrics, cfg.seed)
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
    policy = load_model(model.init, seed=cfg.seed, mesh=self.mesh, random_init=model.random_init,
                        **model.overrides).model
    if resume is None and cfg.sft.steps:
      policy = self._cold_start(policy)
    learner = self._learner(policy)
    start, value_pretrained = 0, cfg.value_pretrain_steps == 0
    if resume is not None:
      learner.state, cursor = self.ckpt.restore(learner.state)
      start, value_pretrained = int(cursor["step"]), bool(cursor.get("value_pretrained", True))
      log.info("resuming after RL step %d (checkpoint %d)", start, resume)
    self.metrics.truncate("rl", start + 1)
    self.metrics.truncate("eval", start + 1)
    skipped_steps = 0
    with PolicySession(cfg, self.workdir / "calls", policy=learner.policy_copy(), version=start, seed=cfg.seed,
                       workdir=self.workdir) as session:
      if session.engine is None and (resume is not None or cfg.sft.steps):
        # A remote engine serves model.init (or what it last loaded): give it the learner's weights, so
        # that the first step samples from pi_old and not from another policy.
        session.push(learner.policy_copy(), start)
      for step in range(start + 1, cfg.steps + 1):
        t0 = time.time()
        jobs, data, replayed = self._step_data(session, step)
        rollout_s = time.time() - t0
        t1 = time.time()
        m = self._update(learner, data, pretrain_value=not value_pretrained)
        value_pretrained = True
        learner_s = time.time() - t1
        skipped_steps = skipped_steps + 1 if m["skipped_updates"] else 0
        if skipped_steps >= cfg.max_skipped_steps:
          raise RuntimeError(
              f"step {step}: {skipped_steps} steps in a row had an update with a non-finite loss or gradient "
              f"(skipped; the parameters were kept). Inspect this step's data: "
              f"{self.workdir / 'steps' / f'step_{step}' / 'rollouts.jsonl'} and its calls in "
              f"{self.workdir / 'calls'}")
        t2 = time.time()
        try:
          session.push(learner.policy_copy(), step)
        except PolicyUpdateError:
          self.ckpt.save(learner.state, cursor={"step": step, "value_pretrained": True})  # keep what was trained
          raise
        push_s = time.time() - t2
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
          self.ckpt.save(learner.state, cursor={"step": step, "value_pretrained": True})
        n_ok = len(data.rewards)
        m.update(reward_metrics(data))
        m.update(data.tree_stats)
        m.update({f"count/{k}": float(v) for k, v in data.counts.items()})
        m.update({"rollouts": float(len(jobs)), "rollouts_ok": float(n_ok),
                  "over_branching_rate": data.counts.get("over_branching", 0) / max(n_ok, 1),
                  "rollout_s": rollout_s, "learner_s": learner_s, "push_s": push_s,
                  "policy_version": float(session.version), "replayed": float(replayed)})
        self.metrics.write("rl", step, m)
        log.info("step %d/%d: reward %.3f (%d/%d ok), rollouts %.0f s, learner %.1f s", step, cfg.steps,
                 m.get("reward/mean", float("nan")), n_ok, len(jobs), rollout_s, learner_s)
        if cfg.eval_every and step % cfg.eval_every == 0:
          self._evaluate(session, step)
    self.metrics.close()
    summary = summarize(self.workdir)
    summary["wall_s"] = round(time.time() - t_run, 1)
    summary["isolation"] = self.isolation
    (self.workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.plot:
      from clawjax.train.plots import plot_run  # pylint: disable=import-outside-toplevel  (matplotlib)
      plot_run(self.workdir)
    return summary


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
