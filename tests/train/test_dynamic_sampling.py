"""Dynamic sampling (batch.min_informative_groups) in both loops, on the simulated clock (async_sim.py):
a step draws further task samples until it holds enough groups whose rewards differ, trains none whose
rewards are all equal, reports the tasks it drew, and at the cap trains on what it has."""
from __future__ import annotations

import pytest

from clawjax.config import ConfigError
from clawjax.train.config import train_config
from tests.train import async_sim as sim
from tests.train.test_configs import QUICKSTART, _load

# Tasks named "same*" score every rollout alike (a group without signal); the others alternate 0, 1.
TASKS = [sim.task(name) for name in ("same-a", "same-b", "same-c", "mixed-a", "same-d", "mixed-b")]


def _reward(job) -> float:
  return 1.0 if job.task.task_id.startswith("same") else float(job.index % 2)


def _run(tmp_path, async_rl: bool, steps: int, tasks=TASKS, **batch):
  cfg = sim.config(steps, tasks_per_step=2, rollouts=2, max_staleness=1 if async_rl else 0, async_rl=async_rl,
                   batch=batch)
  return sim.run(tmp_path, cfg, tasks, lambda job, label: 1.0, learner_time=0.5, reward=_reward), cfg


def _groups(trained: sim.Trained) -> dict[str, set]:
  """The step's trained groups by kind (from its packed batches' rollout ids: label-task-index-n)."""
  tasks = {rid.split("-", 1)[1].rsplit("-", 2)[0] for b in trained.data.batches for rid in b.rollout_ids_N}
  return {"same": {t for t in tasks if t.startswith("same")}, "mixed": {t for t in tasks if t.startswith("mixed")}}


def _draws(run: sim.SimRun, trained: sim.Trained, async_rl: bool) -> list[list[str]]:
  """The tasks of each draw a step trained on: first its own sample (the asynchronous loop takes whichever
  groups completed first, the earliest launched: its groups.json), then its further samples, each a
  function of (seed, step, draw), numbered below 0."""
  trainer, step = run.trainer, trained.step
  further = [trainer.step_groups(step, d) for d in range(1, int(trained.extra["sampling/draws"]))]
  if not async_rl:
    return [[g.task.task_id for g in groups] for groups in [trainer.step_groups(step)] + further]
  taken = run.groups_by_step[step]
  assert sorted(i for i in taken if i < 0) == sorted(g.index for groups in further for g in groups)
  return [[trainer.group(i).task.task_id for i in taken if i >= 0]] + [[g.task.task_id for g in groups]
                                                                      for groups in further]


@pytest.mark.parametrize("async_rl", [False, True], ids=["sync", "async"])
def test_steps_draw_until_enough_groups_differ_and_train_none_without_signal(tmp_path, async_rl):
  off, _ = _run(tmp_path / "off", async_rl, 6)
  # Without it, groups without signal train.
  assert any(_groups(t)["same"] and t.data.tree_stats["trained_uninformative_groups"] for t in off.steps.trained)
  assert all(t.extra["sampling/draws"] == 1 and t.extra["sampling/tasks_drawn"] == 2 for t in off.steps.trained)

  run, _ = _run(tmp_path / "on", async_rl, 6, min_informative_groups=2, max_draw_factor=8)
  assert [t.step for t in run.steps.trained] == list(range(1, 7))
  for t in run.steps.trained:
    draws = _draws(run, t, async_rl)
    drawn = [task for draw in draws for task in draw]
    mixed = [task for task in drawn if task.startswith("mixed")]
    # Exactly as many draws as it took to hold two groups with signal.
    before_last = [task for draw in draws[:-1] for task in draw]
    assert len(mixed) >= 2 and sum(task.startswith("mixed") for task in before_last) < 2
    assert t.extra["sampling/tasks_drawn"] == len(drawn) == 2 * t.extra["sampling/draws"] == t.extra["groups/drawn"]
    assert t.extra["sampling/informative_groups"] == len(mixed) and t.extra["sampling/short"] == 0
    assert not _groups(t)["same"] and len(_groups(t)["mixed"]) >= 1
    assert t.data.tree_stats["trained_uninformative_groups"] == 0
    assert t.data.counts["uninformative"] == 2 * (len(drawn) - len(mixed))  # left out, and counted
  assert max(t.extra["sampling/draws"] for t in run.steps.trained) > 1  # some step had to draw again
  # Every further draw's group (numbered below 0) ran its two rollouts once.
  extra_groups = sum(2 * (t.extra["sampling/draws"] - 1) for t in run.steps.trained)
  assert sum(n for g, n in run.session.runs_of.items() if g < 0) == 2 * extra_groups


@pytest.mark.parametrize("async_rl", [False, True], ids=["sync", "async"])
def test_at_the_cap_a_step_trains_what_it_has_and_says_so(tmp_path, async_rl):
  # Two of any three tasks hold a mixed one: every draw has a group to train, never the five asked for.
  tasks = [sim.task(name) for name in ("same-a", "mixed-a", "mixed-b")]
  run, _ = _run(tmp_path, async_rl, 3, tasks, min_informative_groups=5, max_draw_factor=2)
  for t in run.steps.trained:
    assert t.extra["sampling/draws"] == 2 and t.extra["sampling/tasks_drawn"] == 4
    assert t.extra["sampling/short"] == 1 and not _groups(t)["same"]


def test_dynamic_sampling_is_checked_with_the_config():
  base = _load(QUICKSTART).get_config()
  assert train_config(base, ["batch.min_informative_groups=4"]).batch.max_draw_factor == 4
  with pytest.raises(ConfigError, match=r"^config\.batch: .*max_draw_factor >= 1"):
    train_config(base, ["batch.min_informative_groups=4", "batch.max_draw_factor=0"])
  with pytest.raises(ConfigError, match=r"^config\.batch\.min_informative_groups: draws tasks until .* 'ppo'"):
    train_config(base, ["batch.min_informative_groups=4", "learner.loss=ppo", "learner.value.kind=shared"])
