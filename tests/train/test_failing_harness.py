"""A harness that cannot work in this run fails fast and says why (as a new user met it: the quickstart
with `--config.harnesses=mini,claude_code` trained mini while every Claude Code rollout failed, every
step, with "the harness made no model call (exit 1)" and an empty stderr; the cause, "Prompt is too
long", sat only in the records' stdout tail):
- the config check knows each harness's smallest context and stops the run before anything starts;
- a harness that fails every one of its rollouts of a step the same way stops the run after that step
  (trained and checkpointed), with one line naming it and its own last words (real Claude Code, its start
  check lifted by a plugin);
- the harness's last words are the failure's reason: its JSON result's error, its stderr, its stdout."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from clawjax.config import ConfigError
from clawjax.harness.adapters import get_adapter
from clawjax.train.config import train_config
from clawjax.train.failing_harness import FailingHarnesses

from tests.harness.helpers import install_or_skip

ROOT = pathlib.Path(__file__).resolve().parents[2]
CLAUDE_TOO_LONG = ("one line\n" + json.dumps({"type": "result", "subtype": "success", "is_error": True,
                                              "result": "Prompt is too long", "terminal_reason": "blocking_limit"}))
OPENCLAW_TOO_SMALL = json.dumps({"ok": False, "status": "error", "final": "", "error": {
    "message": "Model context window too small (1024 tokens; source=modelsConfig). Minimum is 4000.",
    "kind": "exception"}}, indent=2)


def _train_py(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "experiments" / "train.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_quickstart_with_claude_code_stops_before_anything_starts(tmp_path):
  out = _train_py("--config=configs/quickstart.py", "--config.harnesses=mini,claude_code", f"--workdir={tmp_path / 'run'}")
  assert out.returncode == 1
  assert out.stderr.strip().splitlines() == [
      "error: config.harnesses: claude_code needs a context of at least 27,000 tokens (its own prompt is ~12K "
      "tokens, and with less it ends every task with \"Prompt is too long\"), but a call holds at most 1,024 here "
      "(the smaller of shim.max_context=1024 and engine.options.max_seq_len=1024): raise that, or leave "
      "claude_code out"]
  assert not (tmp_path / "run").exists()


def _quickstart():
  spec = importlib.util.spec_from_file_location("quickstart", ROOT / "configs" / "quickstart.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.parametrize("harness,window,ok", [("claude_code", 27_000, True), ("claude_code", 26_999, False),
                                               ("openclaw", 8192, True), ("openclaw", 4096, False),
                                               ("mini", 1024, True), ("mini", 256, False)])
def test_each_harness_needs_its_known_context(harness, window, ok):
  overrides = [f"harnesses={harness}", f"shim.max_context={window}", f"engine.options.max_seq_len={window}"]
  if ok:
    assert train_config(_quickstart(), overrides).harnesses == (harness,)
  else:
    with pytest.raises(ConfigError, match=rf"^config.harnesses: {harness} needs a context of at least "):
      train_config(_quickstart(), overrides)


def test_the_last_words_are_the_harness_own():
  claude, openclaw = get_adapter("claude_code"), get_adapter("openclaw")
  assert claude.last_words(CLAUDE_TOO_LONG, "") == "error: Prompt is too long"
  assert openclaw.last_words(OPENCLAW_TOO_SMALL, "[agent] low context window\n[agent] blocked\n") == (
      "error: Model context window too small (1024 tokens; source=modelsConfig). Minimum is 4000.")
  mini = get_adapter("mini")
  assert mini.last_words("step 1\n", "Traceback ...\nModuleNotFoundError: No module named 'clawjax'\n\n") == (
      "stderr: ModuleNotFoundError: No module named 'clawjax'")
  assert mini.last_words("thinking\nout of turns\n", "") == "stdout: out of turns"
  assert mini.last_words("", "") is None
  assert len(mini.last_words("", "x" * 5000)) == len("stderr: ") + 300


def _summary(harnesses: dict) -> dict:
  return {"harnesses": harnesses}


SAME = {"rollouts": 2, "failed": {"failed; the harness made no model call (exit 1); error: Prompt is too long": 2}}
HALF = {"rollouts": 1, "failed": {next(iter(SAME["failed"])): 1}}


def test_a_harness_failing_every_rollout_the_same_way_is_named():
  line = FailingHarnesses(1).check([_summary({"mini": {"rollouts": 2, "failed": {}}, "claude_code": SAME})], step=3)
  assert line == ("config.harnesses: claude_code failed every one of its 2 rollouts of step 3 the same way (failed; "
                  "the harness made no model call (exit 1); error: Prompt is too long), so it cannot work in this "
                  "run; fix that, or leave claude_code out (step 3 was trained and checkpointed)")
  # Over processes: one process's share alone does not decide.
  assert FailingHarnesses(1).check([_summary({"claude_code": HALF}),
                                    _summary({"claude_code": {"rollouts": 1, "failed": {}}})], step=3) is None
  assert FailingHarnesses(1).check([_summary({"claude_code": HALF}), _summary({"claude_code": HALF})], step=3)
  # Two reasons, one rollout, a rollout that ran, or a timeout: the run goes on.
  for o in ({"rollouts": 2, "failed": {"failed; a": 1, "failed; b": 1}}, HALF, {"rollouts": 3, "failed": {"failed; a": 2}}):
    assert FailingHarnesses(1).check([_summary({"claude_code": o})], step=1) is None
  assert FailingHarnesses(0).check([_summary({"claude_code": SAME})], step=1) is None  # never


def test_failing_harness_steps_counts_steps_in_a_row():
  watch = FailingHarnesses(2)
  ok = _summary({"claude_code": {"rollouts": 2, "failed": {}}})
  assert [watch.check([s], step) for step, s in enumerate([_summary({"claude_code": SAME}), ok,
                                                           _summary({"claude_code": SAME})], 1)] == [None] * 3
  assert "of step 4 the same way (failed; the harness made no model call (exit 1); error: Prompt is too long) " \
         "(2 steps in a row), so" in watch.check([_summary({"claude_code": SAME})], step=4)


UNCHECKED = """from clawjax.harness import adapters

class Unchecked(adapters.ClaudeCode):
  min_context = 0  # the start check lifted: what the rollouts then say

adapters.ADAPTERS["claude_code"] = Unchecked()
"""


@pytest.mark.slow
@pytest.mark.harness
def test_a_harness_that_fails_every_rollout_stops_the_run_after_the_step_with_its_reason(tmp_path):
  install_or_skip("claude_code")
  (tmp_path / "unchecked_claude.py").write_text(UNCHECKED)
  workdir = tmp_path / "run"
  out = _train_py("--config=configs/quickstart.py", "--config.harnesses=mini,claude_code",
                  f"--config.plugins={tmp_path / 'unchecked_claude.py'}", f"--workdir={workdir}", "--config.steps=3",
                  "--config.tasks_per_step=1", "--config.rollouts_per_task=2", "--config.sft.steps=0",
                  "--config.batch.rows=2", "--config.plot=False", "--config.tensorboard=False", timeout=900)
  assert out.returncode == 1, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1] == (
      "error: config.harnesses: claude_code failed every one of its 2 rollouts of step 1 the same way (failed; the "
      "harness made no model call (exit 1); error: Prompt is too long), so it cannot work in this run; fix that, or "
      "leave claude_code out (step 1 was trained and checkpointed)")
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [(r["phase"], r["step"], r["rollouts_ok"]) for r in rows] == [("rl", 1, 2.0)]  # mini's group trained
  assert (workdir / "checkpoints" / "1").is_dir()  # checkpoint_every is 5: saved for the stop
  step_line = next(line for line in out.stderr.splitlines() if "step 1/3: reward" in line)
  assert "failures: 2 x failed; the harness made no model call (exit 1); error: Prompt is too long" in step_line
