"""Asynchronous RL on CPU: rollouts of the next step run while the learner updates, a step trains the
oldest completed groups (a straggling group moves to a later step instead of holding this one, until it
is due), the staleness of the trained calls is measured, and a run resumed after a crash runs again the
groups that were in flight and never trains a group twice.

The loop's scheduling on a simulated clock (tests/train/async_sim.py): slow tasks are trained as often as
they are sampled and no group is dropped, whatever max_staleness; no group is launched past the last
step; an empty step is run again under its number and keeps its earlier attempts' drops; a call without a
version, or with one ahead of the learner's, is never trained; ids the model cannot read stop the run;
and with two processes, a process that owns no group of a step goes on."""
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
from clawjax.harness.rollout import RolloutConfig
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from clawjax.run.session import RolloutJob
from clawjax.tree.vocab import VocabularyError
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


def _durations(slow: set[str], factor: float = 2.0, jitter: float = 0.3):
  """Clock units of a rollout: 1 (a slow task's `factor`), times a factor in [1 - jitter, 1 + jitter] drawn
  from the rollout's name, so that every run of the loop sees the same durations."""
  def duration(job: RolloutJob, label: str) -> float:
    seed = zlib.crc32(f"{label}/{job.task.task_id}/{job.index}".encode())
    return (factor if job.task.task_id in slow else 1.0) * np.random.default_rng(seed).uniform(1 - jitter, 1 + jitter)
  return duration


def _by_group(slow: set[int], factor: float = 10.0, jitter: float = 0.1):
  """Clock units of a rollout: 1 (a slow group's `factor`), times a factor drawn from its group and index."""
  def duration(job: RolloutJob, label: str) -> float:
    seed = zlib.crc32(f"{job.group}/{job.index}".encode())
    return (factor if job.group in slow else 1.0) * np.random.default_rng(seed).uniform(1 - jitter, 1 + jitter)
  return duration


def _every_group_trained_once_in_time(run: sim.SimRun, groups: int, max_staleness: int) -> None:
  """Each of the run's `groups` groups trained by exactly one step, none dropped, and every trained call
  at most `max_staleness` versions behind the policy it trains."""
  trained = sorted(i for step in run.groups_by_step.values() for i in step)
  assert trained == list(range(groups)), run.groups_by_step
  assert not any(run.dropped_by_step.values()), run.dropped_by_step
  assert sum(t.dropped for t in run.steps.trained) == 0
  assert {int(k) for t in run.steps.trained for k in t.data.staleness} <= set(range(max_staleness + 1))


@pytest.mark.parametrize("max_staleness, factor, steps", [(1, 2.0, 100), (2, 4.0, 30), (3, 4.0, 30)])
def test_slow_tasks_are_trained_as_often_as_they_are_sampled(tmp_path, max_staleness, factor, steps):
  """16 tasks, 4 a step, 4 of them `factor` times as slow: every sampled group is trained, once and
  within the staleness bound, so the slow tasks' share of the trained groups is their share of the
  sampled ones. (Taking the first groups to complete and dropping those trained after their own step
  trained the slow tasks' groups far less; waiting only for the groups due now still let stragglers
  fall due together at max_staleness >= 2, more of them than a step takes, and dropped the rest: 2 of
  these 30 steps' groups at 4 x, both at max_staleness 2 and 3.)"""
  tasks = [sim.task(f"t{i:02d}") for i in range(16)]
  slow = {t.task_id for t in tasks[:4]}
  run = sim.run(tmp_path, sim.config(steps, tasks_per_step=4, rollouts=2, max_staleness=max_staleness), tasks,
                _durations(slow, factor), learner_time=0.5)
  _every_group_trained_once_in_time(run, steps * 4, max_staleness)


def test_stragglers_launched_together_are_taken_in_time(tmp_path):
  """max_staleness 2, 2 groups a step, the first three groups ten times as slow: all three are launched
  at version 0 and must be trained by version 2, more than step 3 alone takes, so an earlier step waits
  for one of them. (Waiting only for the groups due now trained two at step 3 and dropped g2 at step 4.)"""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  run = sim.run(tmp_path, sim.config(6, tasks_per_step=2, rollouts=2, max_staleness=2), tasks, _by_group({0, 1, 2}),
                learner_time=0.5)
  _every_group_trained_once_in_time(run, 12, max_staleness=2)
  assert [t.step for t in run.steps.trained] == [1, 2, 3, 4, 5, 6]


def test_no_group_is_launched_past_the_last_step(tmp_path):
  """3 steps of 2 groups, max_staleness 1: groups 0-5 run, each once; step 4's groups (6 and 7), which no
  step would train, never start."""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  run = sim.run(tmp_path, sim.config(3, tasks_per_step=2, rollouts=2, max_staleness=1), tasks, _by_group(set()),
                learner_time=0.5)
  assert dict(run.session.runs_of) == {g: 2 for g in range(6)}
  assert sorted(p.name for p in run.trainer.layout.groups_dir.iterdir()) == [f"g{g}.jsonl" for g in range(6)]
  _every_group_trained_once_in_time(run, 6, max_staleness=1)


def test_a_groups_jobs_name_its_draw():
  """Both loops run a group's jobs (GroupRunner, Trainer.step_jobs): each carries the group's index, which
  the policy session writes into its record."""
  tasks = [sim.task(f"t{i}") for i in range(3)]
  for group in sim.SimTrainer(sim.config(2, 2, 2, 1), pathlib.Path("unused"), tasks).step_groups(2):
    assert [job.group for job in group.jobs(3)] == [group.index] * 3


def test_an_empty_step_is_run_again_under_its_number(tmp_path):
  """One group a step; every rollout of group 1 fails the first time it runs. Whichever step takes it
  first (step 1 or 2, by which group completes first) has nothing to train: it runs its group again and
  trains under its own number; every step, the last included, trains (and so pushes and checkpoints)."""
  tasks = [sim.task(f"t{i}") for i in range(3)]
  fails = lambda job, label, runs: job.group == 1 and runs == 0
  run = sim.run(tmp_path, sim.config(4, tasks_per_step=1, rollouts=2, max_staleness=1), tasks, _durations(set()),
                learner_time=0.5, fails=fails)
  assert [t.step for t in run.steps.trained] == [1, 2, 3, 4]  # no step skipped, none trained twice
  assert [len(run.groups_by_step[s]) for s in (1, 2, 3, 4)] == [1, 1, 1, 1]
  assert sorted(g for step in run.groups_by_step.values() for g in step) == [0, 1, 2, 3]
  assert dict(run.session.runs_of) == {0: 2, 1: 4, 2: 2, 3: 2}  # group 1 ran twice, the others once


def test_an_empty_steps_earlier_drops_are_recorded(tmp_path):
  """One group a step; group 1's calls report no policy version the first time it runs. The step that
  takes it drops it, has nothing else to train, and runs it again: its groups.json and its metrics keep
  that drop (and its unversioned calls) although a later attempt trained."""
  tasks = [sim.task(f"t{i}") for i in range(3)]
  call_version = lambda job, label, runs, version: None if job.group == 1 and runs == 0 else version
  run = sim.run(tmp_path, sim.config(4, tasks_per_step=1, rollouts=2, max_staleness=1), tasks, _durations(set()),
                learner_time=0.5, call_version=call_version)
  assert [t.step for t in run.steps.trained] == [1, 2, 3, 4]
  (step,) = [s for s, dropped in run.dropped_by_step.items() if dropped]
  assert run.dropped_by_step[step] == [1]
  (t,) = [t for t in run.steps.trained if t.step == step]
  assert t.extra["groups/dropped_stale"] == 1 and t.extra["calls_without_version"] == 2
  assert sorted(g for s in run.groups_by_step.values() for g in s) == [0, 1, 2, 3]  # its second run trains


def test_a_group_whose_rollout_hangs_is_dropped_as_overdue_and_the_run_trains_on(tmp_path):
  """Two groups a step; one rollout of group 1 never ends (a harness or checker that hangs past every
  timeout of its own). At its deadline (5 clock units from its start; a rollout takes about 1) the group
  is given up: the step that takes it drops it as overdue, counts it, and trains the other group; every
  step trains, and no group but group 1 is dropped."""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  cfg = sim.config(3, tasks_per_step=2, rollouts=2, max_staleness=1, rollout=RolloutConfig(group_deadline_s=5.0))
  normal = _durations(set())
  duration = lambda job, label: 1e9 if job.group == 1 and job.index == 0 else normal(job, label)
  run = sim.run(tmp_path, cfg, tasks, duration, learner_time=0.5)
  assert [t.step for t in run.steps.trained] == [1, 2, 3]
  assert {s: d for s, d in run.overdue_by_step.items() if d} == {2: [1]}  # (step 1 took groups 0 and 2)
  assert sorted(g for step in run.groups_by_step.values() for g in step) == [0, 2, 3, 4, 5]
  (t,) = [t for t in run.steps.trained if t.step == 2]
  assert t.extra["groups/dropped_overdue"] == 1 and t.extra["groups/taken"] == 2
  assert (t.data.counts["overdue"], t.data.counts["overdue_groups"]) == (2, 1)  # both rollouts: one given up
  assert t.data.tree_stats["trained_rollouts"] == 2
  records = [r for r in iter_records(tmp_path / "groups" / "g1.jsonl") if isinstance(r, RolloutRecord)]
  (given_up,) = [r for r in records if r.extra.get("overdue")]
  assert given_up.status == "timeout" and "passed its deadline of 5 s" in given_up.extra["reason"]
  assert len(records) == 2  # the hung rollout's own record never comes; the other ended in time


def test_a_group_with_an_unversioned_call_is_never_trained(tmp_path):
  """The rollouts of one of step 2's groups report no policy version: the group is dropped as stale and
  its calls counted, the others train."""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  cfg = sim.config(3, tasks_per_step=2, rollouts=2, max_staleness=1, empty_step_retries=0)
  (group, _) = sim.SimTrainer(cfg, tmp_path, tasks).step_groups(2)
  call_version = lambda job, label, runs, version: None if job.group == group.index else version
  run = sim.run(tmp_path, cfg, tasks, _durations(set()), learner_time=0.5, call_version=call_version)
  trained = [i for step in run.groups_by_step.values() for i in step]
  assert group.index not in trained and len(trained) == 5
  assert sum(t.extra["calls_without_version"] for t in run.steps.trained) == 2
  assert sum(t.dropped for t in run.steps.trained) == 1


def test_a_call_sampled_by_a_version_ahead_of_the_learner_is_never_trained(tmp_path):
  """The calls of group 3 report a version beyond the run's last (a replica holding a crashed run's later
  weights): its rollouts are excluded as `version_ahead` and counted, not trained as fresh; every trained
  call is at most one version behind."""
  tasks = [sim.task(f"t{i}") for i in range(4)]
  call_version = lambda job, label, runs, version: version + 5 if job.group == 3 else version
  run = sim.run(tmp_path, sim.config(3, tasks_per_step=2, rollouts=2, max_staleness=1), tasks, _durations(set()),
                learner_time=0.5, call_version=call_version)
  assert sum(t.data.counts.get("version_ahead", 0) for t in run.steps.trained) == 2
  trained_rollouts = {rid for t in run.steps.trained for b in t.data.batches for rid in b.rollout_ids_N}
  assert len(trained_rollouts) == 10 and {int(k) for t in run.steps.trained for k in t.data.staleness} <= {0, 1}


def test_ids_the_model_cannot_read_stop_the_run(tmp_path):
  """The engine's ids reach past the learner's vocabulary (64 against 32): the first step stops the run
  with one line naming a call and the vocabulary size."""
  tasks = [sim.task(f"t{i}") for i in range(2)]
  with pytest.raises(VocabularyError, match=r"^step 1: .* call 0 of rollout s[12]-.*outside the model's vocabulary "
                                            r"\[0, 32\): the engine and the learner probably serve different models"):
    sim.run(tmp_path, sim.config(3, tasks_per_step=1, rollouts=2, max_staleness=1), tasks, _durations(set()),
            learner_time=0.5, vocab_size=32)


@pytest.mark.slow  # two JAX processes start (about 40 s on a loaded machine)
def test_two_processes_go_on_when_one_owns_no_group_of_a_step(tmp_path):
  """One group a step, two processes: each owns every other step's group (g mod 2), so in each step one
  of them has none to train; both run all steps."""
  processes.run(["-m", "tests.train.async_two_processes", str(tmp_path / "run")], tmp_path, "two", devices=1)
  for i in (0, 1):
    trained = json.loads((tmp_path / "run" / f"trained.process_{i}.json").read_text())
    assert [step for step, _ in trained] == [1, 2, 3, 4]
    assert [g for _, groups in trained for g in groups] == [i, i + 2]
