"""The RL loop behind real Claude Code and real OpenClaw (and real Codex): the paper's mix-harness config
(configs/paper/mix_harness_30a3b.py: both harnesses on the same task, each its own GRPO group, the 64K
window) run by `experiments/train.py`, shrunk on the command line to CPU size: every token sampled by the
embedded engine (test-tiny: Qwen3's architecture, vocabulary and template at toy width, random weights),
one synchronous step behind Claude Code and OpenClaw, then, resumed with `async_rl` and Codex (the Responses
API) in OpenClaw's place, one asynchronous step.

The checker's reward is a hash of the scoring directory (fresh per rollout), so that rewards differ within
a group and advantages are not zero. Checked: calls logged per harness; each call went through the tree
filters (counted by reason); one group per (task, harness); the parameters moved."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from clawjax.calllog import load
from clawjax.models.loading import load_model
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from tests.harness.helpers import install_or_skip
from tests.train.test_e2e import CHECK_PY, REWARD_SH

pytestmark = [pytest.mark.harness, pytest.mark.slow]

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The paper's config at CPU size. Both groups share one 32K row (each harness's ~10K-token prompt is
# stored once per group: prompt sharing).
SHRUNK = ["--config.model.init=test-tiny", '--config.model.overrides={"attention_impl": "blocked"}',
          "--config.engine.backend=embedded",
          '--config.engine.options={"max_slots": 4, "max_seq_len": 65536, "prefill_chunk": 2048}',
          "--config.tasks_per_step=1", "--config.rollouts_per_task=2", "--config.concurrency=4",
          "--config.shim.max_new_tokens=24", "--config.rollout.timeout_s=600", "--config.rollout.settle_interval_s=0.2",
          "--config.rollout.harness.max_turns=1", "--config.rollout.harness.timeout_s=540", "--config.rollout.sandbox.mode=auto",
          "--config.batch.row_len=32768", "--config.batch.rows=1", "--config.learner.lr=1e-2",
          "--config.learner.logits_chunk=64", "--config.learner.micro_batches=1",
          "--config.progress=false", "--config.plot=false", "--config.tensorboard=false"]


def _task_dir(root):
  task = root / "tasks" / "notes"
  (task / "reward").mkdir(parents=True)
  (task / "data_entry.json").write_text(json.dumps({
      "task_id": "notes", "user_query": "Write notes.txt with one line about the weather.",
      "metadata": {"category": "test"}}))
  (task / "reward" / "check.py").write_text(CHECK_PY)
  (task / "reward" / "reward.sh").write_text(REWARD_SH)
  return root / "tasks"


def _train(tasks: pathlib.Path, workdir: pathlib.Path, *extra: str) -> None:
  # One CPU device, as a CPU box runs it: the suite's eight simulated devices would split the two cores
  # eight ways around the one row.
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  proc = subprocess.run([sys.executable, "experiments/train.py", "--config=configs/paper/mix_harness_30a3b.py",
                         f"--config.tasks={tasks}", f"--workdir={workdir}", *SHRUNK, *extra],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
  assert proc.returncode == 0, proc.stderr[-3000:]


def _check_step(row, loaded, label, harnesses):
  """A step's calls came from every harness, went through the filters, and trained the policy."""
  ok_calls = [c for rid, calls in loaded.calls.items() if rid.startswith(label) for c in calls if c.status == "ok"]
  assert {c.harness for c in ok_calls} == set(harnesses)
  assert all(len(c.input_ids) > 5000 for c in ok_calls)  # the harnesses' real prompts
  # Each logged call of a scored rollout went through the filters, counted by its reason.
  assert sum(v for k, v in row.items() if k.startswith("count/calls_")) == len(ok_calls)
  assert row["count/calls_train"] > 0
  for harness in harnesses:  # one GRPO group per (task, harness)
    assert f"reward_group/notes/{harness}/mean" in row
  assert row["trained_rollouts"] > 0 and row["updates"] >= 1 and row["grad_norm"] > 0
  return ok_calls


def test_a_mix_harness_run_behind_real_harnesses_sync_then_async(tmp_path):
  for name in ("claude_code", "openclaw", "codex"):
    install_or_skip(name)
  tasks, workdir = _task_dir(tmp_path), tmp_path / "run"
  _train(tasks, workdir, "--config.steps=1")
  _train(tasks, workdir, "--config.steps=2", "--config.async_rl=true", "--config.harnesses=codex,claude_code",
         "--config.allow_config_change=true")
  rows = read_metrics(workdir, "rl")
  assert [r["step"] for r in rows] == [1, 2] and "groups/taken" in rows[1] and "groups/taken" not in rows[0]
  loaded = load(workdir / "calls", errors="collect")
  _check_step(rows[0], loaded, "s1-", ("claude_code", "openclaw"))
  ok_calls = _check_step(rows[1], loaded, "s2-", ("codex", "claude_code"))
  assert {c.extra["api"] for c in ok_calls if c.harness == "codex"} == {"responses"}
  assert {c.role for c in ok_calls if c.harness == "codex"} == {"main"}

  # The parameters moved: the checkpoint's policy differs from the initial one.
  cfg = train_config(json.loads((workdir / "config.json").read_text()))
  initial = load_model(cfg.model.init, seed=cfg.seed, **cfg.model.overrides).model
  learner = Learner(cfg.learner, initial)
  before = jax.device_get(learner.state.params["policy"])
  learner.state, _ = Checkpointer(workdir / "checkpoints").restore(learner.state)
  after = jax.device_get(learner.state.params["policy"])
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
