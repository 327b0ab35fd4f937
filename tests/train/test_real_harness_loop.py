"""The RL loop behind real Claude Code and real OpenClaw: a mix-harness run (both harnesses on the same
task, each its own GRPO group) with every token sampled by the embedded engine (test-tiny: Qwen3's
architecture, vocabulary and template at toy width, random weights) in the paper's 64K window, one
synchronous step, then, resumed with `async_rl`, one asynchronous step.

The checker's reward is a hash of the scoring directory (fresh per rollout), so that rewards differ within
a group and advantages are not zero. Checked: calls logged per harness; each call went through the tree
filters (counted by reason); one group per (task, harness); the parameters moved."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from clawjax.calllog import load
from clawjax.models.loading import load_model
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train
from tests.harness.helpers import install_or_skip
from tests.train.test_e2e import CHECK_PY, REWARD_SH

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def _task_dir(root):
  task = root / "tasks" / "notes"
  (task / "reward").mkdir(parents=True)
  (task / "data_entry.json").write_text(json.dumps({
      "task_id": "notes", "user_query": "Write notes.txt with one line about the weather.",
      "metadata": {"category": "test"}}))
  (task / "reward" / "check.py").write_text(CHECK_PY)
  (task / "reward" / "reward.sh").write_text(REWARD_SH)
  return root / "tasks"


def _config(tasks, steps: int, async_rl: bool):
  return train_config({
      "tasks": str(tasks), "harnesses": ("claude_code", "openclaw"), "tasks_per_step": 1,
      "rollouts_per_task": 2, "steps": steps, "concurrency": 4, "async_rl": async_rl,
      "allow_config_change": async_rl,
      "progress": False, "plot": False, "tensorboard": False,
      "model": {"init": "test-tiny", "overrides": {"attention_impl": "blocked"}},
      "engine": {"options": {"max_slots": 4, "max_seq_len": 65536, "prefill_chunk": 2048}},
      "shim": {"max_new_tokens": 24, "temperature": 1.0},  # the 64K window: ShimConfig's default
      "rollout": {"timeout_s": 600.0, "settle_interval_s": 0.2, "harness": {"max_turns": 1, "timeout_s": 540.0}},
      # Both groups in one row: each group's ~10K-token harness prompt is stored once (prompt sharing).
      "batch": {"row_len": 32768, "rows": 1, "max_staleness": 1},
      "learner": {"lr": 1e-2, "logits_chunk": 64, "micro_batches": 1},
  })


def test_a_mix_harness_run_behind_real_harnesses_sync_then_async(tmp_path):
  for name in ("claude_code", "openclaw"):
    install_or_skip(name)
  tasks, workdir = _task_dir(tmp_path), tmp_path / "run"
  train(_config(tasks, steps=1, async_rl=False), workdir)
  cfg = _config(tasks, steps=2, async_rl=True)
  train(cfg, workdir)
  rows = read_metrics(workdir, "rl")
  assert [r["step"] for r in rows] == [1, 2] and "groups/taken" in rows[1] and "groups/taken" not in rows[0]
  loaded = load(workdir / "calls", errors="collect")
  for row, label in zip(rows, ("s1-", "s2-")):
    ok_calls = [c for rid, calls in loaded.calls.items() if rid.startswith(label) for c in calls if c.status == "ok"]
    assert {c.harness for c in ok_calls} == {"claude_code", "openclaw"}
    assert all(len(c.input_ids) > 5000 for c in ok_calls)  # the harnesses' real prompts
    # Each logged call of a scored rollout went through the filters, counted by its reason.
    assert sum(v for k, v in row.items() if k.startswith("count/calls_")) == len(ok_calls)
    assert row["count/calls_train"] > 0
    for harness in ("claude_code", "openclaw"):  # one GRPO group per (task, harness)
      assert f"reward_group/notes/{harness}/mean" in row
    assert row["trained_rollouts"] > 0 and row["updates"] >= 1 and row["grad_norm"] > 0

  # The parameters moved: the checkpoint's policy differs from the initial one.
  initial = load_model("test-tiny", seed=cfg.seed, attention_impl="blocked").model
  learner = Learner(cfg.learner, initial)
  before = jax.device_get(learner.state.params["policy"])
  learner.state, _ = Checkpointer(workdir / "checkpoints").restore(learner.state)
  after = jax.device_get(learner.state.params["policy"])
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
