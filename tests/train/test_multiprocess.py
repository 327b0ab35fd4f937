"""Two processes on this machine as two hosts (JAX's multi-controller runtime, CPU gloo collectives, two
devices each), the command of docs/cluster.md: each process runs its own shim, harnesses
and groups, the learner's step spans both, and process 0 writes the run's files once. Then the same
commands with more steps resume from the checkpoint; killed (kill -9, both processes) in the middle of a
step, they have added exactly the steps before it, and the next run completes them. Also one RL step's
updates on two processes against one process on the same groups (tests/train/rl_update_worker.py)."""
from __future__ import annotations

import json
import pathlib
import signal
import time

import jax
import numpy as np
import pytest

from clawjax.calllog import RolloutRecord, iter_records
from clawjax.sharding import MeshConfig
from tests import processes
from tests.rl.learner_batches import rel_diff
from tests.train import rl_update_worker


def _argv(workdir: pathlib.Path, steps: int, extra: list[str]) -> list[str]:
  return ["experiments/train.py", "--config=configs/quickstart.py", f"--workdir={workdir}", f"--config.steps={steps}",
          "--config.sft.steps=0", "--config.tasks_per_step=2", "--config.rollouts_per_task=4",
          "--config.concurrency=4", "--config.batch.rows=8", "--config.plot=false", *extra]


def _run(workdir: pathlib.Path, steps: int, tag: str, extra: list[str] = ()) -> None:
  processes.run(_argv(workdir, steps, list(extra)), workdir.parent, tag)


def _rl_steps(workdir: pathlib.Path) -> list[dict]:
  return [r for line in (workdir / "metrics.jsonl").read_text().splitlines()
          if (r := json.loads(line))["phase"] == "rl"]


@pytest.mark.slow
def test_two_processes_train_resume_and_survive_a_kill(tmp_path):
  workdir = tmp_path / "run"
  _run(workdir, 2, "first")
  rows = _rl_steps(workdir)
  assert [r["step"] for r in rows] == [1, 2] and all(r["num_processes"] == 2 for r in rows)
  for step in (1, 2):
    # Each process ran its own groups (g mod 2); a group's four rollouts all on one process.
    by_process = {}
    for i in (0, 1):
      records = [r for r in iter_records(workdir / "steps" / f"step_{step}" / f"rollouts.process_{i}.jsonl")
                 if isinstance(r, RolloutRecord)]
      assert records and {r.extra["process_index"] for r in records} == {i}
      by_process[i] = {r.task_id for r in records}
      assert all(len([r for r in records if r.task_id == t]) == 4 for t in by_process[i])
      assert all((workdir / "calls" / f"process_{i}" / f"{r.rollout_id}.jsonl").exists()
                 for r in records if r.status == "ok")
    assert not by_process[0] & by_process[1]
  assert rows[0]["rollouts"] == 8 and rows[0]["rollouts_ok"] == 8  # both processes' rollouts, counted once
  assert json.loads((workdir / "summary.json").read_text())["num_processes"] == 2

  # The same command with more steps resumes from step 2; kill -9 of both processes once step 4's learner is
  # running leaves exactly step 3 added, and the same command again completes the run.
  procs = processes.start(_argv(workdir, 5, []), tmp_path, "killed")
  log = tmp_path / "killed.process_0.log"
  deadline = time.time() + 600
  while "step 4/5: learner update" not in log.read_text():
    assert time.time() < deadline and all(p.poll() is None for p in procs), log.read_text()[-3000:]
    time.sleep(0.5)
  for p in procs:
    p.send_signal(signal.SIGKILL)
    p.wait()
  assert [r["step"] for r in _rl_steps(workdir)] == [1, 2, 3]
  _run(workdir, 5, "after_kill")
  assert [r["step"] for r in _rl_steps(workdir)] == [1, 2, 3, 4, 5]


@pytest.mark.slow  # ~40 s on 2 loaded cores: a 2-process update and its one-process reference, each compiling
def test_two_processes_make_the_updates_of_one_on_the_same_data(tmp_path):
  """batch.rows counts the rows of an update over all processes: 4 groups of one row each with rows=2 are
  2 updates of 2 rows on one process, and on two (each process packs its 2 groups into its 1 row of each
  update). Same updates, same params (float32: the processes' partial sums add in another order)."""
  processes.run(["-m", "tests.train.rl_update_worker", str(tmp_path / "two")], tmp_path, "rl_update", devices=1)
  rl_update_worker.run(tmp_path / "one", MeshConfig(data=2), jax.devices()[:2])
  two, one = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("two", "one"))
  assert one["batches"] == 2 and two["batches"] == 2  # process 0's: its two groups, one row each
  assert one["updates"] == two["updates"] == 2 and one["skipped_updates"] == two["skipped_updates"] == 0
  assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-6)
  got, want = np.load(tmp_path / "two" / "params.npz"), np.load(tmp_path / "one" / "params.npz")
  assert sorted(got.files) == sorted(want.files)
  assert rel_diff([got[n] for n in want.files], [want[n] for n in want.files]) < 1e-5
