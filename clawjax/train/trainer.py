"""The RL loop: black-box RL of the model behind an unmodified harness (ClawGym II), one step at a time.

  train(config, workdir) -> summary dict

Per step k: sample tasks (a fixed function of (seed, k), so a resumed run sees the same data order)
-> for each (task, harness) group `rollouts_per_task` rollouts through the shim, `concurrency` at a
time (clawjax.run.session; each record names its group's index) -> settle, score
(clawjax.harness.rollout) -> filter and build trees, GRPO advantages per group, one draw of a (task,
harness) pair (step_data.py) -> learner updates over tree-packed batches with TIS (pi_old recomputed
inside the step) -> push the weights to the engine -> Orbax checkpoint -> metrics ->
periodic held-out evaluation (steps.py). With `async_rl` the next steps' rollouts run while the learner
works (async_loop.py).

WORKDIR layout (layout.py; several processes keep per-process names): calls/<rollout_id>.jsonl (the
shim's call logs), steps/step_<k>/rollouts.jsonl (rollout records), checkpoints/ (Orbax; the cursor holds
the RL step), metrics.jsonl + tb/ (metrics.py), sft/ (cold-start demonstrations), config.json,
environment.json (clawjax/environment.py), summary.json, *.png, report.html. Rerunning the same command
resumes from the last checkpoint (the config must match config.json, see config.py); a step whose
rollouts all finished before a crash is replayed from its logs.

Weight push: embedded engine in place (`Engine.update_from_model`; an engine with devices of its own,
`engine.options.devices`, gets them device to device while the learner trains on the other devices);
sglang: safetensors export + the backend's `update_weights_from_disk` (which flushes the engine's
prefix cache; calls in flight drained or aborted: `engine.push_mode`), on every replica, the first
before any rollout (the weights the run starts or resumes from). The policy version is the RL step:
every call records the version that sampled it, and `batch.max_staleness` bounds how old a trained call
may be. A resumed run pushes its checkpoint's step, which the engine takes even when it holds a
later step's weights (pushed before a crash that came before their checkpoint,
clawjax.run.session.PolicySession).

Several processes (cfg.distributed, one per host, the same command on each): each runs its own shim and
harnesses for its own groups (layout.py), the learner's step is one global step over every process's
rows, and process 0 writes the run-wide files.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax import config as config_lib
from clawjax import distributed, progress, sharding
from clawjax.calllog import CallLogWriter, RolloutRecord, iter_records
from clawjax.config import ConfigError
from clawjax.engine.placement import learner_devices
from clawjax.models.loading import load_model
from clawjax.models.model import Decoder
from clawjax.report.run import write_report
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from clawjax.run.session import PolicySession, RolloutJob
from clawjax.run.start import start_run
from clawjax.serving.backends.embedded import engine_config
from clawjax.tasks import select_tasks
from clawjax.train.async_loop import run_async
from clawjax.train.cold_start import record_demos, run_sft
from clawjax.train.config import SFT_ONE_PROCESS, TrainConfig, check_resume
from clawjax.train.groups import Group, step_groups
from clawjax.train.layout import RunLayout
from clawjax.train.metrics import MetricsWriter, read_metrics
from clawjax.train.step_data import StepData, build_step, failure_reasons, has_data
from clawjax.train.steps import StepTrainer

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


def _replayable(path: pathlib.Path, n_jobs: int) -> bool:
  """Whether a crashed run left all of this step's rollout records (then they are reused)."""
  if not path.exists():
    return False
  try:
    return sum(isinstance(r, RolloutRecord) for r in iter_records(path)) == n_jobs
  except ValueError:
    return False


def _set_aside(path: pathlib.Path) -> None:
  """Keeps what a crash interrupted, under a new name, so the redo starts clean."""
  if path.exists():
    path.rename(path.with_name(f"{path.name}.partial-{int(time.time())}"))


class Trainer:
  """Holds a run's learner, policy session and writers; `run()` trains to `cfg.steps`. In a
  multi-process run (cfg.distributed; clawjax.distributed.initialize first) every process holds one."""

  def __init__(self, cfg: TrainConfig, workdir: str | pathlib.Path):
    self.cfg, self.workdir = cfg, pathlib.Path(workdir)
    self.layout = RunLayout(self.workdir, distributed.process_index(), distributed.process_count())
    self.workdir.mkdir(parents=True, exist_ok=True)
    self._check_config()
    self.isolation = start_run(cfg.rollout, self.workdir, cfg.harnesses, record_environment=self.layout.primary)
    self.tasks = select_tasks(cfg.tasks, cfg.task_ids)
    self.eval_tasks = select_tasks(cfg.eval_tasks) if cfg.eval_tasks else []
    self.metrics = MetricsWriter(self.workdir, cfg.tensorboard, enabled=self.layout.primary)
    self.ckpt = Checkpointer(self.workdir / "checkpoints", cfg.keep_checkpoints)
    sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert]
    # An embedded engine with devices of its own (engine.options.devices): the learner keeps the others,
    # and each push moves the weights device to device.
    available = learner_devices(self.engine_own_devices)
    devices = available if -1 in sizes else available[:math.prod(sizes)]
    self.mesh = sharding.make_mesh(cfg.mesh, devices)

  @property
  def engine_own_devices(self) -> int:
    cfg = self.cfg.engine
    return engine_config(cfg.options).devices if cfg.backend == "embedded" else 0

  def _check_config(self) -> None:
    """A resume (a checkpoint exists) must match the config it started with (config.json)."""
    path = self.workdir / CONFIG_FILE
    if path.exists() and (self.workdir / "checkpoints").exists():
      check_resume(json.loads(path.read_text()), self.cfg)
    distributed.sync("config checked")  # before process 0 rewrites it

  def _pin_config(self) -> None:
    """Writes config.json once the run has started (model loaded, engine and shim up): a start that fails
    leaves no config.json behind to refuse the corrected command."""
    if self.layout.primary:
      (self.workdir / CONFIG_FILE).write_text(json.dumps(config_lib.to_json(self.cfg), indent=2) + "\n")

  # ---- data order and ownership ------------------------------------------------------------------

  def group(self, index: int) -> Group:
    """Group `index` of the run's data order."""
    per_step = len(step_groups(self.cfg.seed, self.cfg.tasks_per_step, self.cfg.harnesses, self.tasks, 1))
    return self.step_groups(index // per_step + 1)[index % per_step]

  def step_groups(self, step: int) -> list[Group]:
    return step_groups(self.cfg.seed, self.cfg.tasks_per_step, self.cfg.harnesses, self.tasks, step)

  def owns(self, group: Group) -> bool:
    return self.layout.owns(group)

  def own_groups(self, step: int) -> list[Group]:
    return [g for g in self.step_groups(step) if self.owns(g)]

  def step_jobs(self, step: int) -> list[RolloutJob]:
    """This process's rollouts of `step`: a function of (seed, step, process) only, so resuming replays it."""
    return [job for g in self.own_groups(step) for job in g.jobs(self.cfg.rollouts_per_task)]

  # ---- pieces of a run ----------------------------------------------------------------------------

  def engine_policy(self, learner: Learner) -> Decoder:
    """The policy for this process's engine, with buffers of its own (the learner donates its arrays). An
    embedded engine holds whole local arrays: in a multi-process run each process gathers them (a small
    model's case; large ones are served by a remote engine, which reads the export)."""
    if distributed.process_count() == 1 or self.cfg.engine.backend != "embedded":
      # An engine on devices of its own copies the weights as it moves them there.
      return learner.policy_model() if self.engine_own_devices else learner.policy_copy()
    local = lambda tree: jax.tree.map(
        lambda a: jnp.asarray(distributed.gather(a)) if isinstance(a, jax.Array) else a, tree)
    return nnx.merge(learner.policy_def, local(learner.state.params["policy"]), local(learner.policy_rest))

  def _learner(self, policy: Decoder) -> Learner:
    cfg = self.cfg
    value = None
    if cfg.learner.value.kind != "none":
      trunk = nnx.clone(policy) if cfg.learner.value.kind == "separate" else None
      value = make_value_model(cfg.learner.value.kind, policy.cfg.d_model, trunk)
    return Learner(cfg.learner, policy, value=value, mesh=self.mesh)

  def _cold_start(self, policy: Decoder) -> Decoder:
    cfg = self.cfg
    if self.layout.process_count > 1:  # (auto-detected processes; TrainConfig refuses the explicit case)
      raise ConfigError(f"config.sft.steps: {SFT_ONE_PROCESS}")
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

  def evaluate(self, session: PolicySession, step: int) -> None:
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
    """Runs this process's rollouts of the step (or, unless `again`, finds them all logged by a run that
    crashed after them)."""
    jobs = self.step_jobs(step)
    path = self.layout.rollouts_file(step)
    replayed = not again and _replayable(path, len(jobs))
    if not replayed:
      _set_aside(path)
      path.parent.mkdir(parents=True, exist_ok=True)
      with CallLogWriter(path) as writer:
        session.run(jobs, writer, label=f"s{step}", desc=f"step {step}/{self.cfg.steps}",
                    group_deadline_s=self.cfg.rollout.group_deadline())
    return jobs, path, replayed

  def _step_data(self, session: PolicySession, step: int, vocab_size: int
                 ) -> tuple[list[RolloutJob], StepData, bool]:
    """The step's rollouts as training data for a model of `vocab_size` tokens; a step with nothing to
    train (on any process) is run again up to `empty_step_retries` times, then the run stops with the
    failures' reasons."""
    cfg = self.cfg
    for attempt in range(cfg.empty_step_retries + 1):
      jobs, path, replayed = self._rollouts(session, step, again=attempt > 0)
      loaded = self.layout.load(path)
      data = build_step(loaded, policy_version=session.version, vocab_size=vocab_size, filters=cfg.filters,
                        batch=cfg.batch)
      if has_data(data, step):
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
    with PolicySession(cfg, self.layout.calls_dir, policy=self.engine_policy(learner), version=start,
                       seed=cfg.seed, workdir=self.workdir, process_index=self.layout.process_index) as session:
      if session.engine is None:
        # A remote engine serves what it was started with or last loaded (model.init, a crashed run's
        # later step), under no version ("default") or another run's: before the first rollout it gets
        # the learner's weights as version `start`, so that the first step samples pi_old and every
        # call carries a version that batch.max_staleness can bound.
        session.push(self.engine_policy(learner), start)
      self._pin_config()
      steps = StepTrainer(self, session, learner, cursor)
      if cfg.async_rl:
        run_async(self, steps, start)
      else:
        self._sync_loop(steps, start)
    self.metrics.close()
    summary = summarize(self.workdir)
    summary["wall_s"] = round(time.time() - t_run, 1)
    summary["isolation"] = self.isolation
    summary["num_processes"] = self.layout.process_count
    if self.layout.primary:
      (self.workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
      if cfg.plot:
        from clawjax.train.plots import plot_run  # pylint: disable=import-outside-toplevel  (matplotlib)
        plot_run(self.workdir)
      write_report(self.workdir)
    return summary

  def _sync_loop(self, steps: StepTrainer, start: int) -> None:
    """The paper's recipe: a step's rollouts all run on the weights of the previous update."""
    for step in range(start + 1, self.cfg.steps + 1):
      t0 = time.time()
      jobs, data, replayed = self._step_data(steps.session, step, steps.vocab_size)
      steps.train(step, data, {"rollouts": float(len(jobs)), "rollout_s": time.time() - t0,
                               "replayed": float(replayed)}, data_path=self.layout.rollouts_file(step))


def summarize(workdir: str | pathlib.Path, window: int = 5) -> dict[str, Any]:
  """steps, and the mean reward of the first and last `window` RL steps (from metrics.jsonl)."""
  rows = sorted(read_metrics(workdir, "rl"), key=lambda r: r["step"])
  rewards = [r.get("reward/mean", 0.0) for r in rows]
  mean = lambda xs: round(float(np.mean(xs)), 4) if xs else None
  return {"steps": len(rows), f"reward_first{window}": mean(rewards[:window]),
          f"reward_last{window}": mean(rewards[-window:])}


def train(cfg: TrainConfig, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Trains (or resumes) in `workdir`; returns the summary (steps, reward_first5, reward_last5). Joins
  the run's other processes first when cfg.distributed names them."""
  distributed.initialize(cfg.distributed)
  return Trainer(cfg, workdir).run()
