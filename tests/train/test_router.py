"""Engine replicas behind SGLang's router (the real `sglang-router`, PyPI): two engine servers
(`python -m clawjax.engine`, SGLang's protocol) behind `python -m sglang_router.launch_router --policy
manual`. The trainer's calls go through the router, which keeps each rollout on one replica (the shim's
routing key); every weight push reaches both replicas, and each then reports the step as its version. A
replica that dies between steps is passed over: the run goes on, on the other."""
from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from clawjax.auth import ADMIN_TOKEN_ENV
from clawjax.calllog import load
from clawjax.server_process import free_port, running
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from tests.train.test_e2e import _task_dir

TOKEN = "test-admin-token-for-the-replicas"


def _process(argv: list[str], health: str):
  return running(argv, health, env={ADMIN_TOKEN_ENV: TOKEN})


def _engine(port: int):
  return _process([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port),
                   "--max-slots", "4", "--max-seq-len", "1024"], f"http://127.0.0.1:{port}/health")


def _router(port: int, workers: list[str]):
  pytest.importorskip("sglang_router", reason="sglang-router is not installed (the test extra installs it)")
  return _process([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
                   "--policy", "manual", "--worker-urls", *workers, "--prometheus-port", str(free_port()),
                   "--health-check-interval-secs", "1", "--log-level", "warn"], f"http://127.0.0.1:{port}/health")


def _version(url: str) -> str:
  return json.loads(urllib.request.urlopen(url + "/model_info", timeout=10).read())["weight_version"]


def _config(tasks, router: str, workers: list[str], export: str, steps: int):
  return train_config({
      "tasks": str(tasks), "harnesses": ("mini",), "tasks_per_step": 1, "rollouts_per_task": 4,
      "steps": steps, "concurrency": 4, "progress": False, "plot": False, "tensorboard": False,
      "model": {"init": "test-tiny"},
      "engine": {"backend": "sglang", "url": router, "workers": tuple(workers), "export_dir": export},
      "shim": {"max_new_tokens": 12, "max_context": 1024, "temperature": 1.0},
      "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2, "harness": {"max_turns": 1}},
      "batch": {"row_len": 1024, "rows": 4, "max_staleness": 1},
      "learner": {"lr": 1e-2, "logits_chunk": 16},
  })


@pytest.mark.slow
def test_replicas_behind_the_router_get_every_version_and_one_may_die(tmp_path, monkeypatch):
  monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
  tasks, workdir, export = _task_dir(tmp_path), tmp_path / "run", str(tmp_path / "export")
  ports = [free_port(), free_port()]
  workers = [f"http://127.0.0.1:{p}" for p in ports]
  router = f"http://127.0.0.1:{free_port()}"
  with _engine(ports[0]), _engine(ports[1]) as second, _router(int(router.rsplit(":", 1)[1]), workers):
    train(_config(tasks, router, workers, export, steps=2), workdir)
    assert [_version(w) for w in workers] == ["2", "2"]  # every push reached both replicas
    loaded = load(workdir / "calls", errors="collect")
    assert {c.policy_version for calls in loaded.calls.values() for c in calls if c.status == "ok"} == {0, 1}
    second.kill()  # a replica dies; the run goes on with the other
    second.wait()
    train(_config(tasks, router, workers, export, steps=3), workdir)
    rows = read_metrics(workdir, "rl")
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["trained_rollouts"] > 0
    assert _version(workers[0]) == "3"
