"""Real Claude Code, real OpenClaw and real Codex (from npm) headless through the shim on the scripted
backend.

Each harness makes one tool call that writes hello.txt, gets an injected backend 500 on the next model
call (its own retry then re-sends), and gives a final answer; once with whole turns, once with
--incremental-stream, where the failure comes as an error event after part of the turn was streamed. Checked: the file exists and the task's
checker scores 1, the call log holds every call, the tree has zero drift, and the failed attempt is a
dropped leaf. Skipped only when npm (or its registry) is unreachable.
"""

import contextlib

import pytest

from clawjax.calllog import CallLogWriter
from clawjax.harness import sandbox
from clawjax.harness.adapters import HarnessOptions, get_adapter
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn

from tests.harness.helpers import dumps, install_or_skip, load_rollout, mode_id, start_shim

pytestmark = [pytest.mark.harness, pytest.mark.slow]

# Each harness's own shell tool (names and argument schemas as the harness declares them).
SHELL_CALL = {
    "claude_code": ("Bash", {"command": "printf hello > hello.txt", "description": "write hello.txt"}),
    "openclaw": ("exec", {"command": "printf hello > hello.txt"}),
    "codex": ("exec_command", {"cmd": "printf hello > hello.txt"}),
}
FAILED_CALL = 1  # the backend's second generate call fails with 500


@pytest.fixture(scope="module", params=[(name, incremental) for name in sorted(SHELL_CALL)
                                        for incremental in (False, True)],
                ids=mode_id)
def harness_run(request, template, hello_task, tmp_path_factory):
  # incremental: the shim streams text while the (scripted) model samples it, a token per 3 ms, and
  # the injected failure comes mid-stream (an SSE error event after 5 tokens), not as an HTTP 500.
  name, incremental = request.param
  install_or_skip(name)
  tmp = tmp_path_factory.mktemp(name)
  script = [ScriptTurn(text="I will write the file.", tool_calls=(SHELL_CALL[name],)),
            ScriptTurn(text="Done: hello.txt contains hello.")]
  with contextlib.ExitStack() as stack:
    shim = start_shim(stack, template, tmp / "logs", script, failures={FAILED_CALL: 500},
                      incremental_stream=incremental,
                      backend_options=dict(token_latency_s=0.003, failure_after_tokens=5)
                      if incremental else None)
    config = RolloutConfig(timeout_s=300, settle_interval_s=0.2, work_root=str(tmp / "work"),
                           keep_dirs=True, harness=HarnessOptions(max_turns=6, timeout_s=240))
    with CallLogWriter(tmp / "logs" / "rollouts.jsonl") as writer:
      outcome = run_rollout(shim.url, hello_task, name, config, writer,
                            admin_token=shim.admin_token)
  return (name, outcome, *load_rollout(tmp / "logs", outcome.record.rollout_id))


def test_real_harness_writes_file_and_logs_every_call(harness_run):
  name, outcome, calls, logged, tree = harness_run
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  assert (next(outcome.rollout_dir.glob("hello-*")) / "hello.txt").read_text() == "hello"
  assert logged == rec and rec.harness == get_adapter(name).name
  if sandbox.bwrap_problem() is None:
    assert (rec.extra["sandbox"], rec.extra["network"]) == ("bwrap", "loopback-relay")
  # Tool call, the failed attempt, its retry with the final answer: all logged, in order.
  assert [c.status for c in calls] == ["ok", "error", "ok"], dumps(rec.extra)
  assert [c.call_index for c in calls] == [0, 1, 2] and rec.extra["n_calls"] == 3
  assert all(c.role == "main" for c in calls)
  # The harness's own session transcript was found (checkers such as PinchBench's grade() read it).
  assert rec.extra["transcript_events"] > 0


def test_real_harness_tree_has_no_drift_and_drops_the_failed_attempt(harness_run):
  name, _, calls, _, tree = harness_run
  assert tree.drift_calls == 0
  assert tree.reasons[FAILED_CALL] == "error"
  assert tree.reasons[2] == "train"
  # The failed attempt is a leaf: no later input continues it (it produced no output).
  assert not calls[FAILED_CALL].output_ids
  if name in ("claude_code", "codex"):  # They retry with a byte-identical body
    assert calls[FAILED_CALL].input_ids == calls[2].input_ids


def test_real_harness_trains_the_tool_call(harness_run):
  # OpenClaw moves its <<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> message to the end of every request, so
  # call 0's history is not a prefix of call 2's input; the tree must still see call 0 as continued.
  _, _, _, _, tree = harness_run
  assert tree.reasons[0] == "train"
