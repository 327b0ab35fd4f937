"""Real Claude Code and real OpenClaw at the shim's context limit (a scripted policy for the model).

The shim tells its limit in the POST /rollouts answer, and the adapters pass it on (docs/shim.md, "Context
window"). The task's first tool call prints ~24K characters (`seq 1 5000`, ~21K tokens).
- Claude Code (40K window) compacts by itself past the window less 33K tokens (its output and summary
  reserves), so after each tool result here: its summarising calls are logged with role "compaction"
  and filtered out of the tree, and the main calls after them start from the summary (the script
  answers the compaction requests with one). Not told the window, it takes the unknown model for a
  1M-token one and never compacts, until "prompt is too long" ends the run.
- OpenClaw (30K window), for which the count takes the conversation past the limit, trims the tool
  output to fit: every call fits, none is refused. Not told the window, it ends the run on the shim's
  "prompt is too long".
Both then write the file: the checker scores 1.
"""

import contextlib

import pytest

from clawjax.calllog import CallLogWriter
from clawjax.harness.adapters import HarnessOptions
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn

from tests.harness.helpers import decode_input, dumps, install_or_skip, load_rollout, start_shim

pytestmark = [pytest.mark.harness, pytest.mark.slow]

SUMMARY = ScriptTurn(text="<analysis>The count ran.</analysis>\n<summary>The user wants hello.txt "
                          "containing hello; `seq 1 5000` has run.</summary>")
CASES = {  # harness: (context window, shell tool, script)
    "claude_code": (40_000, "Bash", lambda count, write: [
        ScriptTurn(text="Counting first.", tool_calls=(count,)), SUMMARY,
        ScriptTurn(text="Writing it.", tool_calls=(write,)), SUMMARY, ScriptTurn(text="Done.")]),
    "openclaw": (30_000, "exec", lambda count, write: [
        ScriptTurn(text="Counting first.", tool_calls=(count,)),
        ScriptTurn(text="Writing it.", tool_calls=(write,)), ScriptTurn(text="Done.")]),
}


def _shell(tool: str, command: str):
  return (tool, {"command": command, "description": "run"} if tool == "Bash" else {"command": command})


@pytest.fixture(scope="module", params=sorted(CASES))
def limited_run(request, template, hello_task, tmp_path_factory):
  name = request.param
  install_or_skip(name)
  window, tool, script = CASES[name]
  tmp = tmp_path_factory.mktemp(name)
  with contextlib.ExitStack() as stack:
    shim = start_shim(stack, template, tmp / "logs",
                      script(_shell(tool, "seq 1 5000"), _shell(tool, "printf hello > hello.txt")),
                      max_context=window)
    config = RolloutConfig(timeout_s=300, settle_interval_s=0.2, work_root=str(tmp / "work"),
                           harness=HarnessOptions(max_turns=8, timeout_s=240))
    with CallLogWriter(tmp / "logs" / "rollouts.jsonl") as writer:
      outcome = run_rollout(shim.url, hello_task, name, config, writer,
                            admin_token=shim.admin_token)
  return (name, window, outcome, *load_rollout(tmp / "logs", outcome.record.rollout_id))


def test_harness_stays_within_the_window_and_finishes(limited_run, template):
  name, window, outcome, calls, _, tree = limited_run
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  assert all(c.status == "ok" and len(c.input_ids) < window for c in calls), dumps(rec.extra)
  assert tree.drift_calls == 0
  # The count reached the model, cut or whole: the call after it holds its end or the trimming note.
  after_count = decode_input(template, calls[1].input_ids)
  assert "\n4999\n5000\n" in after_count or "more characters truncated" in after_count


def test_claude_code_compacts_and_openclaw_trims(limited_run, template):
  name, window, _, calls, _, tree = limited_run
  if name == "claude_code":
    assert [c.role for c in calls] == ["main", "compaction", "main", "compaction", "main"]
    assert [tree.reasons[i] for i in range(5)] == ["train", "compaction", "train", "compaction",
                                                   "train"]
    # The main calls after a compaction start from its summary, not from the whole history.
    assert all(len(calls[i].input_ids) < len(calls[1].input_ids) // 2 for i in (2, 4))
    assert "seq 1 5000` has run" in decode_input(template, calls[2].input_ids)
  else:
    assert [c.role for c in calls] == ["main"] * 3
    assert "more characters truncated" in decode_input(template, calls[1].input_ids)
