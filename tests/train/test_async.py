"""Asynchronous RL on CPU: rollouts of the next step run while the learner updates, a step trains on
the first groups to complete (a straggling group moves to a later step instead of holding this one),
the staleness of the trained calls is measured, and a run resumed after a crash runs again the groups
that were in flight and never trains a group twice."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil

import pytest

from clawjax.harness import adapters
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from tests.train.test_e2e import CHECK_PY, REWARD_SH


class SlowOnTask(adapters.Mini):
  """The mini harness, 20 s late to start on one task (far longer than a whole group of the others takes,
  even on a loaded machine): that task's group straggles."""
  name = "slow_mini"

  def command(self, base_url, api_key, prompt, home, options):
    cmd = super().command(base_url, api_key, prompt, home, options)
    delay = 20 if "SLOW" in prompt else 0
    return dataclasses.replace(cmd, argv=["/bin/sh", "-c", f'sleep {delay}; exec "$@"', "sh", *cmd.argv])


def _tasks(root: pathlib.Path) -> pathlib.Path:
  for name, query in (("slow", "SLOW: say anything."), ("fast", "Say anything."), ("other", "Say more.")):
    task = root / "tasks" / name
    (task / "reward").mkdir(parents=True)
    (task / "data_entry.json").write_text(json.dumps({"task_id": name, "user_query": query,
                                                      "metadata": {"category": "test"}}))
    (task / "reward" / "check.py").write_text(CHECK_PY)
    (task / "reward" / "reward.sh").write_text(REWARD_SH)
  return root / "tasks"


def _config(tasks: pathlib.Path, steps: int):
  return train_config({
      "tasks": str(tasks), "harnesses": ("slow_mini",), "tasks_per_step": 1, "rollouts_per_task": 3,
      "steps": steps, "concurrency": 6, "progress": False, "plot": False, "tensorboard": False,
      "async_rl": True, "seed": 1,
      "model": {"init": "smollm2-135m", "random_init": True, "template": "smollm2",
                "overrides": dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)},
      "engine": {"options": {"max_slots": 6, "max_seq_len": 640}},
      "shim": {"max_new_tokens": 12, "max_context": 640, "temperature": 1.0},
      "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2, "harness": {"max_turns": 1}},
      "batch": {"row_len": 640, "rows": 4, "max_staleness": 1},
      "learner": {"lr": 1e-2, "logits_chunk": 16},
  })


def _trained(workdir: pathlib.Path) -> list[list[str]]:
  steps = sorted((workdir / "steps").glob("step_*/groups.json"), key=lambda p: int(p.parent.name[5:]))
  return [json.loads(p.read_text())["trained"] for p in steps]


@pytest.mark.slow
def test_async_steps_move_past_a_straggler_and_resume_without_training_a_group_twice(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "slow_mini", SlowOnTask())
  tasks = _tasks(tmp_path)
  run = tmp_path / "run"
  train(_config(tasks, steps=2), run)
  rows = read_metrics(run, "rl")
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert r["groups/taken"] == 1 and sum(v for k, v in r.items() if k.startswith("staleness/")) > 0
  # Step 1's sample is the slow task (seed 1); it trains the first group to complete instead.
  first = _trained(run)[0]
  assert first != ["g0"] and rows[0]["groups/deferred"] >= 1
  # A crash after step 2: the run resumes, runs the groups that were in flight again, and trains each
  # group once.
  resumed = tmp_path / "resumed"
  shutil.copytree(run, resumed)
  train(_config(tasks, steps=4), resumed)
  trained = [g for step in _trained(resumed) for g in step]
  assert len(trained) == len(set(trained)) == 4
  assert [r["step"] for r in read_metrics(resumed, "rl")] == [1, 2, 3, 4]
