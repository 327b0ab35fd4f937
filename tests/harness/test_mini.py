"""The mini harness end to end: a real process, through the real shim, inside the sandbox.

The scripted backend stands for the model. The script makes mini hit each behaviour the tree stage
must handle: a backend 500 (mini re-sends the identical request), a malformed tool call (mini re-asks:
a retry dead leaf), a tool call that writes the file, a compaction call (over the token budget), and a
final answer from the compacted context.
"""

import contextlib

import pytest

from clawjax.calllog import CallLogWriter
from clawjax.harness.adapters import HarnessOptions, get_adapter
from clawjax.harness.mini.agent import COMPACTION_PROMPT
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn

from tests.harness.helpers import decode_input, dumps, load_rollout, start_shim

MALFORMED = ScriptTurn(text='<tool_call>\n{"name": "write", "arguments": {"path": "hello.txt", "con\n'
                            '</tool_call>')
WRITE = ScriptTurn(text="Writing it.",
                   tool_calls=(("write", {"path": "hello.txt", "content": "hello"}),))
SUMMARY = ScriptTurn(text="The task: create hello.txt. Done so far: wrote hello.txt with 'hello'.")
FINAL = ScriptTurn(text="hello.txt now contains hello.")


def mini_script(template):
  """Main calls play MALFORMED, WRITE, FINAL in turn; a compaction request gets SUMMARY."""
  main_turns = iter([MALFORMED, WRITE, FINAL])

  def play(input_ids):
    text = decode_input(template, input_ids)
    return SUMMARY if COMPACTION_PROMPT[:40] in text else next(main_turns, FINAL)

  return play


@pytest.fixture(scope="module")
def mini_run(template, hello_task, tmp_path_factory):
  """One mini rollout: (outcome, calls, rollout record as logged, filtered tree)."""
  tmp = tmp_path_factory.mktemp("mini")
  with contextlib.ExitStack() as stack:
    shim = start_shim(stack, template, tmp / "logs", mini_script(template), failures={0: 500})
    config = RolloutConfig(
        timeout_s=120, settle_interval_s=0.1, work_root=str(tmp / "work"), keep_dirs=True,
        harness=HarnessOptions(max_turns=8, mini_args=(
            "--context-budget-tokens", "50", "--http-backoff-s", "0.05")))
    with CallLogWriter(tmp / "logs" / "rollouts.jsonl") as writer:
      outcome = run_rollout(shim.url, hello_task, "mini", config, writer,
                            admin_token=shim.admin_token)
  return (outcome, *load_rollout(tmp / "logs", outcome.record.rollout_id))


def test_mini_rollout_scores_and_logs_every_call(mini_run, template):
  outcome, calls, logged, tree = mini_run
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  assert logged == rec
  assert (next(outcome.rollout_dir.glob("hello-*")) / "hello.txt").read_text() == "hello"
  # 500 (error), malformed, write, compaction, final: every call the harness made is logged.
  assert [c.status for c in calls] == ["error", "ok", "ok", "ok", "ok"]
  assert [c.role for c in calls[1:]] == ["main", "main", "compaction", "main"]
  # The 500 and the malformed attempt were answered by re-sending the same request.
  assert calls[0].input_ids == calls[1].input_ids == calls[2].input_ids
  # The compacted main call starts from [system, task + summary], not from the old history.
  final_prompt = decode_input(template, calls[4].input_ids)
  assert SUMMARY.text in final_prompt and "Writing it." not in final_prompt
  assert rec.extra["n_calls"] == 5 and rec.extra["settled"]
  events = [e["event"] for e in _transcript(outcome)]
  for kind in ("http_retry", "malformed_tool_call", "compaction", "tool", "final"):
    assert kind in events


def _transcript(outcome):
  return get_adapter("mini").transcript(outcome.rollout_dir / "home")


def test_mini_retry_and_compaction_are_filtered_branches(mini_run):
  _, _, _, tree = mini_run
  # The write call ends the pre-compaction segment: trained (paper section 4, longest continuation).
  assert [tree.reasons[i] for i in range(5)] == ["error", "retry", "train", "compaction", "train"]
  assert tree.drift_calls == 0


def test_mini_compacts_when_the_server_says_the_prompt_is_too_long(make_shim, template, hello_task,
                                                                   tmp_path):
  turns = iter([ScriptTurn(text="", tool_calls=(("bash", {"command": "seq 1 2000"}),)), WRITE, FINAL])

  def play(input_ids):
    text = decode_input(template, input_ids)
    return SUMMARY if COMPACTION_PROMPT[:40] in text else next(turns, FINAL)

  shim = make_shim(play, max_context=1500)
  config = RolloutConfig(timeout_s=120, settle_interval_s=0.1, work_root=str(tmp_path / "work"),
                         harness=HarnessOptions(mini_args=("--compaction-input-chars", "1000")))
  outcome = run_rollout(shim.url, hello_task, "mini", config, admin_token=shim.admin_token)
  assert (outcome.record.status, outcome.record.reward) == ("ok", 1.0), dumps(outcome.record.extra)
  calls, _, tree = load_rollout(tmp_path / "logs", outcome.record.rollout_id)
  # The over-long request was refused before generating (nothing logged); the summariser came next.
  assert [c.role for c in calls] == ["main", "compaction", "main", "main"]
  assert all(len(c.input_ids) < 1500 for c in calls)
  assert tree.reasons[1] == "compaction" and tree.reasons[3] == "train"
