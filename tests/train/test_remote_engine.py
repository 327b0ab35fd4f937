"""Training against an engine server over SGLang's protocol (`python -m clawjax.engine`): every push names
the RL step as the weight version, each call records the version that sampled it, and a run (fresh or
resumed) first hands the engine the learner's weights under its step, so that the first step samples
from pi_old and not from what the engine was started with (reported as version "default", as SGLang
does), and every call carries a version. A run resumed against the engine that outlived its crash
pushes its checkpoint's step, though the engine holds a later step's weights."""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import sys
import threading
import time
import urllib.request

import pytest
from aiohttp import web

from clawjax import config as config_lib
from clawjax.auth import ADMIN_TOKEN_ENV
from clawjax.calllog import CallLogWriter, load
from clawjax.harness import adapters
from clawjax.models import hf_io
from clawjax.models.loading import load_model
from clawjax.rl.checkpoint import Checkpointer
from clawjax.run.session import PolicySession, PolicyUpdateError, RolloutJob
from clawjax.serving.backends.sglang import SGLangBackend
from clawjax.serving.front import ShimProcessPool
from clawjax.server_process import free_port, running
from clawjax.tasks import select_tasks
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from tests.serving.test_backends import EngineServer
from tests.train.test_e2e import _task_dir

TOKEN = "test-admin-token-for-the-engine"
ROOT = pathlib.Path(__file__).resolve().parents[2]
quickstart = config_lib.config_module(str(ROOT / "configs" / "quickstart.py"), "quickstart.py")


@contextlib.contextmanager
def engine_server(port: int):
  """An engine server on `port` for the block; yields its URL."""
  with running([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port),
                "--max-slots", "4", "--max-seq-len", "1024"], f"http://127.0.0.1:{port}/health",
               env={ADMIN_TOKEN_ENV: TOKEN}):
    yield f"http://127.0.0.1:{port}"


def _weight_version(url: str) -> str:
  """SGLang's weight_version: a string, the step the trainer named ("default" before any)."""
  return json.loads(urllib.request.urlopen(url + "/model_info", timeout=10).read())["weight_version"]


def _config(tasks, url: str, export: str, steps: int):
  return train_config({
      "tasks": str(tasks), "harnesses": ("mini",), "tasks_per_step": 1, "rollouts_per_task": 4,
      "steps": steps, "concurrency": 4, "progress": False, "plot": False, "tensorboard": False,
      "model": {"init": "test-tiny"},
      "engine": {"backend": "sglang", "url": url, "export_dir": export},
      "shim": {"max_new_tokens": 12, "max_context": 1024, "temperature": 1.0},
      "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2, "harness": {"max_turns": 1}},
      "batch": {"row_len": 1024, "rows": 4, "max_staleness": 1},
      "learner": {"lr": 1e-2, "logits_chunk": 16},
  })


def _versions(workdir, step: int) -> set[int | None]:
  """The policy versions of the calls step `step` trained on (an async run's: of the groups it took)."""
  step_dir = workdir / "steps" / f"step_{step}"
  if (step_dir / "groups.json").exists():
    rollouts = [workdir / "groups" / f"{g}.jsonl" for g in json.loads((step_dir / "groups.json").read_text())["trained"]]
  else:
    rollouts = [step_dir / "rollouts.jsonl"]
  loaded = load([*rollouts, workdir / "calls"], errors="collect")
  return {c.policy_version for rid in loaded.rollouts for c in loaded.calls.get(rid, []) if c.status == "ok"}


@pytest.mark.slow
def test_a_resumed_run_pushes_its_weights_before_the_first_rollout(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  with engine_server(free_port()) as url:
    assert _weight_version(url) == "default"  # SGLang's weight_version before any update: no version
    train(_config(tasks, url, export, steps=1), workdir)
    assert _versions(workdir, 1) == {0} and _weight_version(url) == "1"  # the initial weights, pushed as 0
  # The cluster restarted: a new engine serves model.init again, under no version.
  with engine_server(free_port()) as url:
    assert _weight_version(url) == "default"
    summary = train(_config(tasks, url, export, steps=2), workdir)
    assert summary["steps"] == 2
    assert _versions(workdir, 2) == {1}  # sampled by the step-1 weights the trainer pushed first
    assert _weight_version(url) == "2"


class Killed(Exception):
  """The trainer's process dying at a chosen point."""


@pytest.mark.slow
def test_a_run_killed_between_push_and_checkpoint_resumes_against_the_engine_that_outlived_it(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  save = Checkpointer.save

  def killed_before_step_2_is_saved(self, state, cursor=None):
    if cursor["step"] == 2:
      raise Killed("after the push of step 2, before its checkpoint")
    return save(self, state, cursor)

  with engine_server(free_port()) as url:
    cfg = _config(tasks, url, export, steps=2)
    with monkeypatch.context() as patch:
      patch.setattr(Checkpointer, "save", killed_before_step_2_is_saved)
      with pytest.raises(Killed):
        train(cfg, workdir)
    assert _weight_version(url) == "2"  # the weights of step 2, which no checkpoint holds
    # The resume goes on from checkpoint 1: it pushes step 1's weights as version 1 (below the engine's
    # 2), then redoes step 2 on the rollouts the step-1 weights sampled, logged before the crash.
    assert train(cfg, workdir)["steps"] == 2
    assert [r["step"] for r in read_metrics(workdir, "rl")] == [1, 2]
    assert _versions(workdir, 2) == {1} and _weight_version(url) == "2"


def test_an_engine_that_ignores_the_pushed_version_is_refused(tmp_path):
  """An engine that takes the weights but not SGLang's weight_version (still "default") would answer
  calls without a version, which batch.max_staleness cannot bound: the push fails, naming it."""

  async def ok(request):
    return web.json_response({"success": True, "message": ""})

  async def model_info(request):
    return web.json_response({"model_path": "test-tiny", "weight_version": "default"})

  routes = {("POST", "/update_weights_from_disk"): ok, ("POST", "/flush_cache"): ok,
            ("GET", "/get_model_info"): model_info}
  with EngineServer(routes) as engine:
    cfg = _config(_task_dir(tmp_path), engine.url, str(tmp_path / "export"), steps=1)
    with PolicySession(cfg, tmp_path / "calls") as session:
      with pytest.raises(PolicyUpdateError, match=rf"^engine sglang at {engine.url} reports no weight version "
                                                  r"after the push of version 0"):
        session.push(load_model("test-tiny").model, 0)


@pytest.mark.slow
def test_shim_worker_processes_serve_the_run_and_the_push_reaches_the_engine(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  with engine_server(free_port()) as url:
    cfg = _config(tasks, url, export, steps=1)
    cfg = dataclasses.replace(cfg, shim=dataclasses.replace(cfg.shim, workers=2))
    summary = train(cfg, workdir)
    assert summary["steps"] == 1 and _weight_version(url) == "1"
    assert _versions(workdir, 1) == {0}
    with PolicySession(cfg, tmp_path / "calls") as session:
      health = json.loads(urllib.request.urlopen(session.url + "/health", timeout=10).read())
      assert isinstance(session.shim, ShimProcessPool) and len(health["workers"]) == 2
      assert session.push(load_model("test-tiny", seed=3).model, 5) == 5 and _weight_version(url) == "5"


@pytest.mark.slow
def test_an_engine_that_refuses_new_weights_ends_the_run_after_the_step_is_checkpointed(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  save = hf_io.save

  def step_1_without_weights(model, out, **kwargs):
    save(model, out, **kwargs)
    if pathlib.Path(out).name == "version_1":  # an export the engine cannot load: it answers 400
      for tensors in pathlib.Path(out).glob("*.safetensors"):
        tensors.unlink()

  with engine_server(free_port()) as url:
    cfg = dataclasses.replace(_config(tasks, url, export, steps=2), async_rl=True)
    with monkeypatch.context() as patch:
      patch.setattr(hf_io, "save", step_1_without_weights)
      with pytest.raises(PolicyUpdateError, match=rf"^engine sglang at {url} refused weight version 1 \(.*400"):
        train(cfg, workdir)
    assert _weight_version(url) == "0"  # the weights the run started from, pushed before its first rollout
    # Step 1 was checkpointed: the run resumes after it, first pushing its weights.
    assert train(cfg, workdir)["steps"] == 2
    assert [r["step"] for r in read_metrics(workdir, "rl")] == [1, 2]
    assert _versions(workdir, 2) == {1} and _weight_version(url) == "2"


# Where a process runs, as "<lowest core> <number of cores>" (the task's checker and the harness below).
_AFFINITY_PY = "import os; a = os.sched_getaffinity(0); print(min(a), len(a))"
_CORES_CHECK_PY = f"""import json, os, subprocess, sys
checker = subprocess.run([sys.executable, "-c", {_AFFINITY_PY!r}], capture_output=True, text=True).stdout.split()
harness = open(os.path.join(sys.argv[1], "harness_cores.txt")).read().split()
print(json.dumps({{"reward": 1.0, "luck": 1.0, "checker_core": int(checker[0]), "checker_cores": int(checker[1]),
                  "harness_core": int(harness[0]), "harness_cores": int(harness[1])}}))
"""


class AffinityMini(adapters.Mini):
  """The mini harness, first writing where it runs into the workspace (for the checker to report)."""
  name = "mini_affinity"

  def command(self, base_url, api_key, prompt, home, options):
    cmd = super().command(base_url, api_key, prompt, home, options)
    return dataclasses.replace(cmd, argv=["/bin/sh", "-c", f'"$0" -c "{_AFFINITY_PY}" > harness_cores.txt; exec "$@"',
                                          sys.executable, *cmd.argv])


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell them apart")
def test_rollout_cores_hold_the_shim_workers_the_harnesses_and_the_checkers(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  monkeypatch.setitem(adapters.ADAPTERS, AffinityMini.name, AffinityMini())
  tasks = _task_dir(tmp_path)
  (tasks / "luck" / "reward" / "check.py").write_text(_CORES_CHECK_PY)  # reward.sh reads its "luck"
  everything = os.sched_getaffinity(0)
  core = max(everything)
  with engine_server(free_port()) as url:
    cfg = _config(tasks, url, str(tmp_path / "export"), steps=1)
    cfg = dataclasses.replace(cfg, shim=dataclasses.replace(cfg.shim, workers=2),
                              rollout=dataclasses.replace(cfg.rollout, cores=str(core)))
    with PolicySession(cfg, tmp_path / "calls") as session, CallLogWriter(tmp_path / "rollouts.jsonl") as writer:
      assert [os.sched_getaffinity(w.proc.pid) for w in session.shim.server.workers] == [{core}, {core}]
      jobs = [RolloutJob(task, AffinityMini.name, i) for task in select_tasks(tasks) for i in range(2)]
      outcomes = session.run(jobs, writer, label="cores", concurrency=2)
  assert os.sched_getaffinity(0) == everything  # the trainer's own thread stays where it was
  for outcome in outcomes:
    assert outcome.record.status == "ok", outcome.record.extra
    assert outcome.record.extra["score"]["metrics"] == {
        "reward": 1.0, "luck": 1.0, "checker_core": core, "checker_cores": 1, "harness_core": core, "harness_cores": 1}


class PushesUnderLoad:
  """Makes each push between steps meet model calls in flight, whatever the machine's speed: the
  rollouts of step s >= 2 start when the push of version s - 1 begins, and that push's weight update is
  sent once a call of theirs is in flight at the engine. (At toy size the learner's first step, its
  compile, outlasts a step's rollouts, so they would all be done by then.) Records each engine request
  and each update as (start, end) in Unix seconds; the update also with the requests in flight as it
  was sent."""

  def __init__(self, monkeypatch, groups_per_step: int, steps: int):
    self.requests: list[tuple[float, float]] = []
    self.updates: list[tuple[int, float, float, int]] = []
    self._in_flight = 0
    self._go = {s: threading.Event() for s in range(2, steps + 1)}
    generate, update, rollout = SGLangBackend.generate, SGLangBackend.update_weights_from_disk, PolicySession.rollout

    async def timed_generate(backend, *args, **kwargs):
      start = time.time()
      self._in_flight += 1
      try:
        return await generate(backend, *args, **kwargs)
      finally:
        self._in_flight -= 1
        self.requests.append((start, time.time()))

    async def loaded_update(backend, path, version, **kwargs):
      if version + 1 in self._go:
        self._go[version + 1].set()
        deadline = time.monotonic() + 300
        while not self._in_flight and time.monotonic() < deadline:
          await asyncio.sleep(0.01)
      start, in_flight = time.time(), self._in_flight
      got = await update(backend, path, version, **kwargs)
      self.updates.append((version, start, time.time(), in_flight))
      return got

    def gated_rollout(session, job, *args, **kwargs):
      step = job.group // groups_per_step + 1
      if step in self._go:
        assert self._go[step].wait(600), f"the push before step {step} never came"
      return rollout(session, job, *args, **kwargs)

    monkeypatch.setattr(SGLangBackend, "generate", timed_generate)
    monkeypatch.setattr(SGLangBackend, "update_weights_from_disk", loaded_update)
    monkeypatch.setattr(PolicySession, "rollout", gated_rollout)


@pytest.mark.slow
def test_an_async_quickstart_run_pushes_while_rollouts_run(tmp_path, monkeypatch):
  """The quickstart with `--config.async_rl=True` (and max_staleness 1, which it needs) against
  `python -m clawjax.engine` as its SGLang server: the next step's rollouts run while the learner
  updates, and every push between steps meets their model calls in flight, which SGLang's update waits
  for, holding new ones back; every push succeeds, and each step trains calls of versions within
  max_staleness. (The last step's push meets none: no group is launched past the last step.)"""
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  steps = 3
  cfg = train_config(quickstart.get_config(), [
      "async_rl=True", "batch.max_staleness=1", f"steps={steps}", "sft.steps=0", "tasks_per_step=2",
      "rollouts_per_task=2", "concurrency=4", "batch.rows=4", "progress=False", "plot=False", "tensorboard=False",
      "engine.backend=sglang", "engine.options={}", "rollout.sandbox.mode=none",  # (isolation: not under test)
      f"engine.export_dir={tmp_path / 'export'}"])
  # The engine server starts from the quickstart's toy architecture; the run pushes its weights first.
  served = hf_io.save(load_model(cfg.model.init, random_init=True, **cfg.model.overrides).model, tmp_path / "served")
  pushes = PushesUnderLoad(monkeypatch, groups_per_step=cfg.tasks_per_step, steps=steps)
  port = free_port()
  with running([sys.executable, "-m", "clawjax.engine", "--model", str(served), "--port", str(port),
                "--max-slots", "8", "--max-seq-len", "1024"], f"http://127.0.0.1:{port}/health",
               env={ADMIN_TOKEN_ENV: TOKEN}):
    url = f"http://127.0.0.1:{port}"
    train(dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, url=url)), tmp_path / "run")
    assert _weight_version(url) == str(steps)
  assert [r["step"] for r in read_metrics(tmp_path / "run", "rl")] == [1, 2, 3]
  assert [u[0] for u in pushes.updates] == [0, 1, 2, 3]  # the initial weights, then each step's
  for version, start, end, in_flight in pushes.updates[1:-1]:
    drained = sum(s < start < e for s, e in pushes.requests)
    held = sum(start < s < end for s, e in pushes.requests)
    print(f"push {version}: {end - start:.2f} s, {drained} calls in flight waited for, {held} held")
    assert in_flight >= 1 and drained >= 1
  calls = [c for c in load([tmp_path / "run" / "calls"], errors="collect").calls.values() for c in c]
  assert {c.policy_version for c in calls if c.status == "ok"} <= {0, 1, 2}
