"""Two RL steps end to end on CPU: a tiny random model in the embedded engine, the real `mini` harness
and shim, a real checker on the workspace. Checks that parameters change, a crashing harness's
rollouts are excluded and counted, the metrics are complete, and a run resumed from the step-1
checkpoint replays step 2 to bitwise-identical parameters."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from clawjax.harness import adapters
from clawjax.train.config import train_config
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import train

# The checker's reward is a hash of the scoring directory (fresh per rollout): rewards differ within
# a group, so GRPO advantages are non-zero even for a random policy.
CHECK_PY = """import hashlib, json, sys
print(json.dumps({"luck": int(hashlib.md5(sys.argv[1].encode()).hexdigest(), 16) % 1000 / 1000}))
"""
REWARD_SH = 'python3 reward/check.py "$PWD" | python3 -c \'import json,sys; print(json.load(sys.stdin)["luck"])\'\n'


class CrashingHarness(adapters.Adapter):
  """A harness that dies before making any call: its rollouts must be excluded and counted."""
  name = "crash"

  def command(self, base_url, api_key, prompt, home, options):
    return adapters.HarnessCommand([sys.executable, "-c", "raise SystemExit(3)"], {}, [])


def _task_dir(root: pathlib.Path) -> pathlib.Path:
  task = root / "tasks" / "luck"
  (task / "reward").mkdir(parents=True)
  (task / "data_entry.json").write_text(json.dumps({
      "task_id": "luck", "user_query": "Say anything.", "metadata": {"category": "test"}}))
  (task / "reward" / "check.py").write_text(CHECK_PY)
  (task / "reward" / "reward.sh").write_text(REWARD_SH)
  return root / "tasks"


def _config(tasks: pathlib.Path, steps: int):
  return train_config({
      "tasks": str(tasks), "harnesses": ("mini", "crash"), "tasks_per_step": 1, "rollouts_per_task": 4,
      "steps": steps, "concurrency": 4, "progress": False, "plot": True,
      "failing_harness_steps": 0,  # (the crash harness fails every rollout: counted, the run goes on)
      "eval_tasks": str(tasks), "eval_every": 2, "eval_samples": 1,
      "model": {"init": "smollm2-135m", "random_init": True, "template": "smollm2",
                "overrides": dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)},
      "engine": {"options": {"max_slots": 4, "max_seq_len": 640}},
      "shim": {"max_new_tokens": 12, "max_context": 640, "temperature": 1.0},
      "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2,
                  "harness": {"max_turns": 1}},
      "batch": {"row_len": 640, "rows": 4, "max_staleness": 0},
      "learner": {"lr": 1e-2, "logits_chunk": 16},
  })


def _restore_arrays(workdir: pathlib.Path, step: int) -> list[np.ndarray]:
  """The train state saved at `step`, read back with plain Orbax (sorted by name)."""
  ckptr = ocp.StandardCheckpointer()
  tree = ckptr.restore((workdir / "checkpoints" / str(step) / "state").absolute())
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow
def test_two_steps_resume_and_crash_accounting(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "crash", CrashingHarness())
  tasks = _task_dir(tmp_path)
  run_a = tmp_path / "a"
  summary = train(_config(tasks, steps=2), run_a)
  assert summary["steps"] == 2

  rows = read_metrics(run_a, "rl")
  assert [r["step"] for r in rows] == [1, 2]
  for r in rows:
    assert r["rollouts"] == 8 and r["count/status_failed"] == 4  # the crash harness, every time
    assert r["rollouts_ok"] == 4 and r["trained_rollouts"] == 4
    for key in ("reward/mean", "reward/std", "reward_harness/mini/mean", "reward_group/luck/mini/mean",
                "count/calls_train", "over_branching_rate", "tree_dedup_ratio",
                "tis_truncated_fraction", "clip_fraction", "entropy", "approx_kl", "grad_norm",
                "tokens_per_s", "rollout_s", "learner_s", "push_s", "mean_abs_logp_old_minus_rollout",
                "policy_version"):
      assert key in r, key
    assert r["grad_norm"] > 0
  assert rows[1]["policy_version"] == 2  # one in-place push per step
  (evaluation,) = read_metrics(run_a, "eval")
  assert evaluation["step"] == 2 and evaluation["ok_fraction"] == 0.5  # held-out: mini ok, crash not
  assert list((run_a / "tb").iterdir()) and (run_a / "reward.png").stat().st_size > 0

  after_1, after_2 = _restore_arrays(run_a, 1), _restore_arrays(run_a, 2)
  assert any(not np.array_equal(a, b) for a, b in zip(after_1, after_2))  # parameters moved

  # A run killed after step 1 (its step-2 rollouts already logged) resumes from the step-1
  # checkpoint, replays step 2 from the logs and lands on the same parameters, bit for bit.
  run_b = tmp_path / "b"
  shutil.copytree(run_a, run_b)
  shutil.rmtree(run_b / "checkpoints" / "2")
  train(_config(tasks, steps=2), run_b)
  assert read_metrics(run_b, "rl")[-1]["replayed"] == 1.0
  assert [r["step"] for r in read_metrics(run_b, "rl")] == [1, 2]
  resumed = _restore_arrays(run_b, 2)
  assert len(resumed) == len(after_2)
  assert all(np.array_equal(a, b) for a, b in zip(resumed, after_2))


class FailingHarness(adapters.Adapter):
  """A harness that cannot even start its model calls, saying why on stderr (as a missing module in a
  sandbox does)."""
  name = "broken"

  def command(self, base_url, api_key, prompt, home, options):
    code = "import sys; sys.stderr.write('ModuleNotFoundError: No module named foo\\n'); raise SystemExit(1)"
    return adapters.HarnessCommand([sys.executable, "-c", code], {}, [])


def test_a_step_with_nothing_to_train_is_retried_then_stops_with_the_reasons(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "broken", FailingHarness())
  monkeypatch.setitem(adapters.ADAPTERS, "crash", CrashingHarness())
  cfg = dataclasses.replace(_config(_task_dir(tmp_path), steps=2), harnesses=("broken",), empty_step_retries=1,
                            eval_every=0)
  with pytest.raises(RuntimeError) as err:
    train(cfg, tmp_path / "run")
  message = str(err.value)
  assert "step 1: no trainable rollout in 2 attempts of 4 rollouts" in message
  assert "4 x failed; the harness made no model call (exit 1); stderr: ModuleNotFoundError: No module named foo" \
      in message
  assert len(list((tmp_path / "run" / "steps" / "step_1").glob("rollouts.jsonl*"))) == 2  # both attempts kept


@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_the_run_stops(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "crash", CrashingHarness())
  plugin = tmp_path / "nan_loss.py"
  plugin.write_text("import jax.numpy as jnp\nfrom clawjax.rl.losses import LossTerms, register_loss\n\n"
                    "@register_loss('nan_for_test')\ndef nan_loss(x, cfg):\n"
                    "  return LossTerms(policy=x.logp * jnp.nan)\n")
  base = _config(_task_dir(tmp_path), steps=3)
  cfg = train_config({**json.loads(json.dumps(dataclasses.asdict(base))), "plugins": (str(plugin),),
                      "harnesses": ("mini",), "eval_every": 0, "max_skipped_steps": 2,
                      "learner": {**dataclasses.asdict(base.learner), "loss": "nan_for_test"}})
  with pytest.raises(RuntimeError, match=r"step 2: 2 steps in a row .* non-finite .*step_2/rollouts.jsonl"):
    train(cfg, tmp_path / "run")
  rows = read_metrics(tmp_path / "run", "rl")
  assert [r["step"] for r in rows] == [1] and rows[0]["skipped_updates"] == 1 and rows[0]["updates"] == 0
