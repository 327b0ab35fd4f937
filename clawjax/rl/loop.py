"""The RL loop: black-box RL of the model behind an unmodified harness (ClawGym II), one step at a time.

  train(config, workdir) -> summary dict

Per step k: sample tasks (a fixed function of (seed, k), so a resumed run sees the same data order)
-> for each (task, harness) `rollouts_per_task` rollouts through the shim, `concurrency` at a time
-> settle, score (clawjax.harness.rollout) -> filter and build trees, GRPO advantages per
(task, harness) group (clawjax.rl.loop_batch) -> learner updates over tree-packed batches with TIS
(pi_old recomputed inside the step) -> push the weights to the engine -> Orbax checkpoint -> metrics
-> periodic held-out evaluation.

WORKDIR layout: calls/<rollout_id>.jsonl (the shim's call logs), steps/step_<k>/rollouts.jsonl (rollout
records), checkpoints/ (Orbax; the cursor holds the RL step), metrics.jsonl + tb/ (loop_metrics.py),
sft/ (cold-start demonstrations), config.json, *.png. Rerunning the same command resumes from the
last checkpoint; a step whose rollouts all finished before a crash is replayed from its logs.

Weight push: embedded engine in place (`Engine.update_from_model`, new policy version); sglang / vllm:
safetensors export + the backend's `update_weights_from_disk` + `flush_cache`. Rollouts of a step run
entirely on the weights of the previous update (the loop is synchronous), so every call's recorded
policy version is current; `batch.max_staleness` still guards against an engine that lags.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import re
import secrets
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax import sharding
from clawjax import tasks as task_lib
from clawjax.calllog import CallLogWriter, LoadedLog, RolloutRecord, iter_records, load
from clawjax.engine.engine import Engine, EngineConfig
from clawjax.engine.loading import REAL_PRESETS, load_model
from clawjax.harness.pool import run_concurrently
from clawjax.harness.rollout import run_rollout
from clawjax.models import hf_io
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.rl.loop_batch import StepData, build_step, reward_metrics
from clawjax.rl.loop_config import ModelSettings, TrainConfig
from clawjax.rl.loop_metrics import MetricsWriter, read_metrics
from clawjax.rl.loop_sft import record_demos, run_sft
from clawjax.rl.value import make_value_model
from clawjax.serving.backends.base import Backend, create_backend
from clawjax.serving.server import ShimThread
from clawjax.tasks import Task
from clawjax.text.templates import ChatTemplate, load_template
from clawjax.tree.pack import pack_trees

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


def build_policy(settings: ModelSettings, seed: int, mesh: jax.sharding.Mesh | None = None) -> Decoder:
  """A random preset architecture (with `overrides`), or real weights from a preset / HF dir (loaded
  shard by shard onto `mesh` when given)."""
  if settings.init in PRESETS and (settings.random_init or settings.init not in REAL_PRESETS):
    return Decoder(PRESETS[settings.init].replace(**settings.overrides), rngs=nnx.Rngs(seed))
  return load_model(settings.init, seed=seed, mesh=mesh, **settings.overrides).model


def select_tasks(path: str, task_ids: tuple[str, ...] = ()) -> list[Task]:
  tasks = task_lib.select_tasks(path, task_ids)
  if not tasks:
    raise ValueError(f"config.tasks: no loadable task in {path}")
  return tasks


def step_jobs(cfg: TrainConfig, tasks: list[Task], step: int) -> list[tuple[Task, str]]:
  """The step's (task, harness) rollouts: a function of (seed, step) only, so resuming replays it."""
  rng = np.random.default_rng([cfg.seed, step])
  order = rng.permutation(len(tasks))[:min(cfg.tasks_per_step, len(tasks))]
  return [(tasks[i], h) for i in order for h in cfg.harnesses for _ in range(cfg.rollouts_per_task)]


def _rollout_id(step: int, task: Task, harness: str, k: int) -> str:
  name = re.sub(r"[^A-Za-z0-9._-]+", "_", task.task_id)[:60]
  return f"s{step}-{name}-{harness}-{k}-{secrets.token_hex(3)}"


def _snapshot(learner: Learner) -> Decoder:
  """The current policy with its own buffers: the learner donates its state at every update, so the
  engine must never hold the learner's arrays."""
  params = jax.tree.map(jnp.copy, learner.state.params["policy"])
  return nnx.merge(learner.policy_def, params, learner.policy_rest)


class PolicyServer:
  """The engine behind the shim and how new weights reach it."""

  def __init__(self, cfg: TrainConfig, template: ChatTemplate, workdir: pathlib.Path, model: Decoder):
    self.cfg, self.workdir = cfg, workdir
    settings = cfg.engine
    self.engine: Engine | None = None
    if settings.backend == "embedded":
      self.engine = Engine(model, EngineConfig(**settings.options))
      backend: Backend = create_backend("embedded", engine=self.engine)
    else:
      backend = create_backend(settings.backend, url=settings.url, model=cfg.model.init, **settings.options)
    self.backend = backend
    self.shim = ShimThread(dataclasses.replace(cfg.shim, log_dir=str(workdir / "calls")), backend, template)
    self.version = 0  # the engine's policy version of the current weights

  def __enter__(self) -> "PolicyServer":
    self.shim.start()
    return self

  def __exit__(self, *exc) -> None:
    self.shim.stop()
    if self.engine is not None:
      self.engine.close()

  def push(self, model: Decoder, step: int) -> int:
    """New weights to the engine; returns the engine's new policy version."""
    if self.engine is not None:
      self.version = self.engine.update_from_model(model)
      return self.version
    out = pathlib.Path(self.cfg.engine.export_dir or self.workdir / "export") / f"step_{step}"
    hf_io.save(model, out)
    version = self.shim.run(self.backend.update_weights_from_disk(str(out)))
    self.shim.run(self.backend.flush_cache())
    self.version = version if version is not None else self.version + 1
    return self.version


def run_jobs(server: PolicyServer, jobs: list[tuple[Task, str]], cfg: TrainConfig, out: pathlib.Path,
             step: int, desc: str) -> list[RolloutRecord]:
  """Runs the jobs; every job ends as one rollout record (a crash in the runner itself included)."""
  out.parent.mkdir(parents=True, exist_ok=True)

  def one(job_index: int, writer: CallLogWriter) -> RolloutRecord:
    task, harness = jobs[job_index]
    rid = _rollout_id(step, task, harness, job_index)
    try:
      return run_rollout(server.shim.url, task, harness, cfg.rollout, writer, rid).record
    except Exception as e:  # pylint: disable=broad-except  (one rollout's bug must not end the run)
      log.exception("rollout %s crashed", rid)
      record = RolloutRecord(rid, task.task_id, harness, None, "failed",
                             {"reason": f"{type(e).__name__}: {e}"})
      writer.write(record)
      return record

  with CallLogWriter(out) as writer:
    return run_concurrently(lambda i: one(i, writer), range(len(jobs)), cfg.concurrency, desc=desc,
                            progress=cfg.progress, score=lambda r: r.reward, status=lambda r: r.status)


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


class Trainer:
  """Holds a run's learner, engine, shim and writers; `run()` trains to `cfg.steps`."""

  def __init__(self, cfg: TrainConfig, workdir: str | pathlib.Path):
    self.cfg, self.workdir = cfg, pathlib.Path(workdir)
    self.workdir.mkdir(parents=True, exist_ok=True)
    (self.workdir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str) + "\n")
    self.tasks = select_tasks(cfg.tasks, cfg.task_ids)
    self.eval_tasks = select_tasks(cfg.eval_tasks) if cfg.eval_tasks else []
    self.template = load_template(cfg.model.template or cfg.model.init, cfg.model.template_family)
    self.metrics = MetricsWriter(self.workdir, cfg.tensorboard)
    self.ckpt = Checkpointer(self.workdir / "checkpoints", cfg.keep_checkpoints)
    self.loss_slots = cfg.learner.logits_chunk
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert]
    devices = jax.devices() if -1 in sizes else jax.devices()[:math.prod(sizes)]
    self.mesh = sharding.make_mesh(cfg.mesh, devices)

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
    if out.exists():  # demonstrations of an SFT stage a crash interrupted: record afresh
      out.rename(self.workdir / f"sft.partial-{int(time.time())}")
    out.mkdir()
    start = time.time()
    trees, scores = record_demos(self.tasks, cfg.harnesses[0], self.template, cfg.sft, cfg.shim,
                                 cfg.rollout, out)
    self.metrics.truncate("sft", 1)
    policy = run_sft(policy, trees, scores, cfg.sft, cfg.learner, self.metrics, cfg.seed)
    log.info("cold-start SFT: %d steps on %d demonstrations in %.0f s", cfg.sft.steps, len(trees),
             time.time() - start)
    return policy

  def _update(self, learner: Learner, data: StepData, pretrain_value: bool) -> dict[str, float]:
    batches = data.batches or [pack_trees([], data.scores, row_len=self.cfg.batch.row_len,
                                          rows=self.cfg.batch.rows)]  # an empty update keeps 1 update per step
    prepared = [learner.prepare(b, loss_slots=self._slots(b)) for b in batches]
    out: dict[str, float] = {}
    if pretrain_value:
      rows = [learner.pretrain_value_step(prepared[i % len(prepared)]) for i in range(self.cfg.value_pretrain_steps)]
      out.update({f"value_pretrain/{k}": v for k, v in rows[-1].items()})
    steps = [learner.step(b) for b in prepared]
    out.update(_mean(steps))
    out["updates"] = float(sum(m["updates"] for m in steps))
    return out

  def _slots(self, batch) -> int:
    """Loss slots per row: a multiple of logits_chunk that only grows (few recompiles)."""
    chunk = self.cfg.learner.logits_chunk
    weight = batch.unique_weight_RT if self.cfg.learner.normalisation == "unique" else batch.path_weight_RT
    need = int((weight > 0).sum(axis=1).max(initial=0))
    self.loss_slots = max(self.loss_slots, -(-need // chunk) * chunk)
    return self.loss_slots

  def _evaluate(self, server: PolicyServer, step: int) -> None:
    cfg = self.cfg
    jobs = [(t, h) for t in self.eval_tasks for h in cfg.harnesses for _ in range(cfg.eval_samples)]
    path = self.workdir / "eval" / f"step_{step}.jsonl"
    path.unlink(missing_ok=True)
    records = run_jobs(server, jobs, cfg, path, step, f"eval {step}")
    rewards = [r.reward if r.status == "ok" and r.reward is not None else 0.0 for r in records]
    self.metrics.write("eval", step, {"reward/mean": float(np.mean(rewards)),
                                      "ok_fraction": float(np.mean([r.status == "ok" for r in records]))})

  def run(self) -> dict[str, Any]:
    cfg = self.cfg
    t_run = time.time()
    resume = self.ckpt.latest_step()
    policy = build_policy(cfg.model, cfg.seed, self.mesh)
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
    with PolicyServer(cfg, self.template, self.workdir, _snapshot(learner)) as server:
      for step in range(start + 1, cfg.steps + 1):
        jobs = step_jobs(cfg, self.tasks, step)
        path = self.workdir / "steps" / f"step_{step}" / "rollouts.jsonl"
        t0 = time.time()
        replayed = _replayable(path, len(jobs))
        if not replayed:
          if path.exists():
            path.rename(path.with_suffix(f".partial-{int(time.time())}"))
          run_jobs(server, jobs, cfg, path, step, f"step {step}/{cfg.steps}")
        rollout_s = time.time() - t0
        data = build_step(load_step_log(self.workdir, path), policy_version=server.version,
                          filters=cfg.filters, batch=cfg.batch)
        t1 = time.time()
        m = self._update(learner, data, pretrain_value=not value_pretrained)
        value_pretrained = True
        learner_s = time.time() - t1
        t2 = time.time()
        server.push(_snapshot(learner), step)
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
                  "policy_version": float(server.version), "replayed": float(replayed)})
        self.metrics.write("rl", step, m)
        log.info("step %d/%d: reward %.3f (%d/%d ok), rollouts %.0f s, learner %.1f s", step, cfg.steps,
                 m.get("reward/mean", float("nan")), n_ok, len(jobs), rollout_s, learner_s)
        if cfg.eval_every and step % cfg.eval_every == 0:
          self._evaluate(server, step)
    self.metrics.close()
    summary = summarize(self.workdir)
    summary["wall_s"] = round(time.time() - t_run, 1)
    (self.workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.plot:
      from clawjax.rl.loop_plot import plot_run  # pylint: disable=import-outside-toplevel  (matplotlib)
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
