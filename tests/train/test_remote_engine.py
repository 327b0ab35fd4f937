"""Training against an engine server over SGLang's protocol (`python -m clawjax.engine`): every push names
the RL step as the weight version, each call records the version that sampled it, and a run resumed
against a freshly started engine (serving model.init again) first hands it the learner's weights, so
that the first step after the resume samples from pi_old and not from the initial policy."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import urllib.request

import pytest

from clawjax.auth import ADMIN_TOKEN_ENV
from clawjax.calllog import load
from clawjax.models.loading import load_model
from clawjax.run.session import PolicySession
from clawjax.serving.front import ShimProcessPool
from clawjax.server_process import free_port, running
from clawjax.train.config import train_config
from clawjax.train.trainer import train
from tests.train.test_e2e import _task_dir

TOKEN = "test-admin-token-for-the-engine"


@contextlib.contextmanager
def engine_server(port: int):
  """An engine server on `port` for the block; yields its URL."""
  with running([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port),
                "--max-slots", "4", "--max-seq-len", "1024"], f"http://127.0.0.1:{port}/health",
               env={ADMIN_TOKEN_ENV: TOKEN}):
    yield f"http://127.0.0.1:{port}"


def _weight_version(url: str) -> int:
  return json.loads(urllib.request.urlopen(url + "/get_model_info", timeout=10).read())["weight_version"]


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
  rollouts = workdir / "steps" / f"step_{step}" / "rollouts.jsonl"
  loaded = load([rollouts, workdir / "calls"], errors="collect")
  return {c.policy_version for rid in loaded.rollouts for c in loaded.calls.get(rid, []) if c.status == "ok"}


@pytest.mark.slow
def test_a_resumed_run_pushes_its_weights_before_the_first_rollout(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  with engine_server(free_port()) as url:
    train(_config(tasks, url, export, steps=1), workdir)
    assert _versions(workdir, 1) == {0} and _weight_version(url) == 1
  # The cluster restarted: a new engine serves model.init again, as version 0.
  with engine_server(free_port()) as url:
    assert _weight_version(url) == 0
    summary = train(_config(tasks, url, export, steps=2), workdir)
    assert summary["steps"] == 2
    assert _versions(workdir, 2) == {1}  # sampled by the step-1 weights the trainer pushed first
    assert _weight_version(url) == 2


@pytest.mark.slow
def test_shim_worker_processes_serve_the_run_and_the_push_reaches_the_engine(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  with engine_server(free_port()) as url:
    cfg = _config(tasks, url, export, steps=1)
    cfg = dataclasses.replace(cfg, shim=dataclasses.replace(cfg.shim, workers=2))
    summary = train(cfg, workdir)
    assert summary["steps"] == 1 and _weight_version(url) == 1
    assert _versions(workdir, 1) == {0}
    with PolicySession(cfg, tmp_path / "calls") as session:
      health = json.loads(urllib.request.urlopen(session.url + "/health", timeout=10).read())
      assert isinstance(session.shim, ShimProcessPool) and len(health["workers"]) == 2
      assert session.push(load_model("test-tiny", seed=3).model, 5) == 5 and _weight_version(url) == 5
