"""configs/quickstart_moe.py at toy size (three RL steps, a short cold start): the embedded engine records
every call's routes, the shim logs them beside the call log, and each step's metrics report the replay:
every position the loss depends on replayed, the float32 learner routing as the float32 engine did."""

import os
import pathlib
import subprocess
import sys

import pytest

from clawjax.calllog import ROUTES_SUFFIX, load
from clawjax.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quickstart_moe_replays_the_engines_routes(tmp_path):
  workdir = tmp_path / "run"
  args = ["--config=configs/quickstart_moe.py", f"--workdir={workdir}", "--config.steps=3",
          "--config.tasks_per_step=1", "--config.rollouts_per_task=2", "--config.concurrency=2",
          "--config.sft.steps=2", "--config.sft.demos_per_task=1", "--config.batch.rows=2",
          "--config.tensorboard=False", "--config.plot=False"]
  proc = subprocess.run([sys.executable, "experiments/train.py", *args], cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = read_metrics(workdir, "rl")
  assert [r["step"] for r in rows] == [1, 2, 3]
  for r in rows:
    assert r["routing/replayed_frac"] >= 0.99 and r["routing/disagree_frac"] == 0.0
    assert r["routing/cross_call_disagree"] == 0.0
  logs = sorted((workdir / "calls").glob("**/*.jsonl"))
  assert logs and all(pathlib.Path(str(p) + ROUTES_SUFFIX).stat().st_size > 0 for p in logs)
  calls = [c for p in logs for cs in load(p).calls.values() for c in cs if c.status == "ok"]
  assert all(c.routed_experts is not None and c.routed_experts.end == len(c.input_ids) + len(c.output_ids) - 1
             for c in calls)
