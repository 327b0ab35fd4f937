"""Asynchronous RL on CPU: rollouts of the next step run while the learner updates, a step trains the
oldest completed groups (a straggling group moves to a later step instead of holding this one, until it
is due), the staleness of the trained calls is measured, and a run resumed after a crash runs again the
groups that were in flight and never trains a group twice.

The loop's scheduling on a simulated clock (tests/train/async_sim.py): slow tasks are trained as often as
they are sampled and no group is dropped, an empty step is run again under its number, a call without a
version is never trained; and with two processes, a process that owns no group of a step goes on."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import zlib

import numpy as np
import pytest

from clawjax.calllog import RolloutRecord, iter_records
from clawjax.harness import adapters
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from clawjax.run.session import RolloutJob
from tests import processes
from tests.train import async_sim as sim
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
  # Every rollout record names its group's draw, which its GRPO group is keyed by.
  for path in (run / "groups").glob("g*.jsonl"):
    records = [r for r in iter_records(path) if isinstance(r, RolloutRecord)]
    assert records and {r.extra["group"] for r in records} == {int(path.stem[1:])}
  # A crash after step 2: the run resumes, runs the groups that were in flight again, and trains each
  # group once.
  resumed = tmp_path / "resumed"
  shutil.copytree(run, resumed)
  train(_config(tasks, steps=4), resumed)
  trained = [g for step in _trained(resumed) for g in step]
  assert len(trained) == len(set(trained)) == 4
  assert [r["step"] for r in read_metrics(resumed, "rl")] == [1, 2, 3, 4]


def _durations(slow: set[str], jitter: float = 0.3):
  """Clock units of a rollout: 1 (a slow task's 2), times a factor in [1 - jitter, 1 + jitter] drawn from
  the rollout's name, so that every run of the loop sees the same durations."""
  def duration(job: RolloutJob, label: str) -> float:
    seed = zlib.crc32(f"{label}/{job.task.task_id}/{job.index}".encode())
    return (2.0 if job.task.task_id in slow else 1.0) * np.random.default_rng(seed).uniform(1 - jitter, 1 + jitter)
  return duration


def test_slow_tasks_are_trained_as_often_as_they_are_sampled(tmp_path):
  """16 tasks, 4 a step, 4 of them twice as slow, max_staleness 1: the slow tasks' share of the trained
  groups is their share of the sampled ones and (almost) no group is dropped. (Taking the first groups to
  complete and dropping those trained after their own step trained the slow tasks' groups far less.)"""
  tasks = [sim.task(f"t{i:02d}") for i in range(16)]
  slow = {t.task_id for t in tasks[:4]}
  steps = 100
  run = sim.run(tmp_path, sim.config(steps, tasks_per_step=4, rollouts=2, max_staleness=1), tasks, _durations(slow),
                learner_time=0.5)
  sampled = [run.trainer.group(i).task.task_id for i in range(steps * 4)]
  trained = [run.trainer.group(i).task.task_id for step in run.groups_by_step.values() for i in step]
  dropped = sum(t.dropped for t in run.steps.trained)
  share = lambda ids: sum(t in slow for t in ids) / len(ids)
  assert abs(share(trained) - share(sampled)) < 0.02, (share(trained), share(sampled))
  assert dropped / len(sampled) < 0.02
  # Every trained call within the bound: at most one version behind the policy it trains.
  assert {int(k) for t in run.steps.trained for k in t.data.staleness} <= {0, 1}


def test_a_groups_jobs_name_its_draw():
  """Both loops run a group's jobs (GroupRunner, Trainer.step_jobs): each carries the group's index, which
  the policy session writes into its record."""
  tasks = [sim.task(f"t{i}") for i in range(3)]
  for group in sim.SimTrainer(sim.config(2, 2, 2, 1), pathlib.Path("unused"), tasks).step_groups(2):
    assert [job.group for job in group.jobs(3)] == [group.index] * 3


def test_an_empty_step_is_run_again_under_its_number(tmp_path):
  """Every rollout of step 2's group fails the first time: the step runs it again and trains it as step
  2; every step, the last included, trains (and so pushes and checkpoints)."""
  tasks = [sim.task(f"t{i}") for i in range(3)]
  fails = lambda job, label, runs: label == "s2" and runs == 0
  run = sim.run(tmp_path, sim.config(4, tasks_per_step=1, rollouts=2, max_staleness=1), tasks, _durations(set()),
                learner_time=0.5, fails=fails)
  assert [t.step for t in run.steps.trained] == [1, 2, 3, 4]
  assert run.groups_by_step[2] == [1]  # group 1 is step 2's sample


def test_a_group_with_an_unversioned_call_is_never_trained(tmp_path):
  """The rollouts of one of step 2's groups report no policy version: the group is dropped as stale and
  its calls counted, the others train."""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  cfg = sim.config(3, tasks_per_step=2, rollouts=2, max_staleness=1, empty_step_retries=0)
  (group, _) = sim.SimTrainer(cfg, tmp_path, tasks).step_groups(2)
  unversioned = lambda job, label, runs: label == "s2" and job.task == group.task
  run = sim.run(tmp_path, cfg, tasks, _durations(set()), learner_time=0.5, unversioned=unversioned)
  trained = [i for step in run.groups_by_step.values() for i in step]
  assert group.index not in trained and len(trained) == 5
  assert sum(t.extra["calls_without_version"] for t in run.steps.trained) == 2
  assert sum(t.dropped for t in run.steps.trained) == 1


@pytest.mark.slow  # two JAX processes start (about 40 s on a loaded machine)
def test_two_processes_go_on_when_one_owns_no_group_of_a_step(tmp_path):
  """One group a step, two processes: each owns every other step's group (g mod 2), so in each step one
  of them has none to train; both run all steps."""
  processes.run(["-m", "tests.train.async_two_processes", str(tmp_path / "run")], tmp_path, "two", devices=1)
  for i in (0, 1):
    trained = json.loads((tmp_path / "run" / f"trained.process_{i}.json").read_text())
    assert [step for step, _ in trained] == [1, 2, 3, 4]
    assert [g for _, groups in trained for g in groups] == [i, i + 2]
