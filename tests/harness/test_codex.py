"""Real Codex CLI (npm @openai/codex 0.169.0) through the shim's Responses API on the scripted backend,
in its sandbox: a multi-turn rollout with thinking and parallel tool calls; a subagent it spawns
(multi_agent_v1); a compaction, local and remote. Checked: the workspace and the task's checker, every
call logged with the role Codex's own metadata gives it, the tree (zero drift, the filters' reasons).
Skipped only when npm (or its registry) is unreachable."""

import contextlib
import json
import re

import pytest

from clawjax.calllog import CallLogWriter
from clawjax.harness import codex, install, sandbox
from clawjax.harness.adapters import HarnessOptions
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn

from tests.harness.helpers import decode_input, dumps, install_or_skip, load_rollout, start_shim

pytestmark = [pytest.mark.harness, pytest.mark.slow]


def _run(template, hello_task, tmp, policy, options=HarnessOptions(), **shim_config):
  """(outcome, calls, rollout record, filtered tree) of one Codex rollout on the hello task."""
  install_or_skip("codex")
  with contextlib.ExitStack() as stack:
    shim = start_shim(stack, template, tmp / "logs", policy, **shim_config)
    config = RolloutConfig(timeout_s=300, settle_interval_s=0.2, work_root=str(tmp / "work"), keep_dirs=True,
                           harness=options)
    with CallLogWriter(tmp / "logs" / "rollouts.jsonl") as writer:
      outcome = run_rollout(shim.url, hello_task, "codex", config, writer, admin_token=shim.admin_token)
  return (outcome, *load_rollout(tmp / "logs", outcome.record.rollout_id))


def _workspace(outcome):
  return next(outcome.rollout_dir.glob("hello-*"))


def _shell(cmd):
  return ("exec_command", {"cmd": cmd})


def _last_user(prompt: str) -> str:
  return prompt.rsplit("<|im_start|>user", 1)[-1]


def test_multi_turn_rollout_with_parallel_calls_has_zero_drift(template, hello_task, tmp_path):
  script = [ScriptTurn(text="Let me look first.", thinking="I need to see the notes.",
                       tool_calls=(_shell("cat notes.txt"), _shell("ls"))),
            ScriptTurn(text="", thinking="Now write it.", tool_calls=(_shell("printf hello > hello.txt"),)),
            ScriptTurn(text="", tool_calls=(_shell("cat hello.txt"),)),
            ScriptTurn(text="Done: hello.txt contains hello.")]
  outcome, calls, logged, tree = _run(template, hello_task, tmp_path, script)
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  assert (_workspace(outcome) / "hello.txt").read_text() == "hello"
  assert logged == rec and rec.harness == "codex" and rec.extra["transcript_events"] > 0
  if sandbox.bwrap_problem() is None:
    assert (rec.extra["sandbox"], rec.extra["network"]) == ("bwrap", "loopback-relay")
  assert rec.extra["harness_result"]["type"] == "turn.completed"
  # The model catalog: no warning about an unknown model, and the prompt is Codex's own for one.
  assert "metadata" not in rec.extra["stderr_tail"], rec.extra["stderr_tail"]
  first = decode_input(template, calls[0].input_ids)
  assert codex.fallback_instructions(install.install_codex()) in first
  assert "Create hello.txt containing the word hello." in first and '"name": "exec_command"' in first
  assert '"name": "multi_agent_v1.spawn_agent"' in first and "web_search" not in first

  assert [c.status for c in calls] == ["ok"] * 4
  assert all(c.extra["api"] == "responses" and c.role == "main" for c in calls)
  assert [c.extra["spliced_turns"] for c in calls] == [0, 1, 2, 3]
  assert [c.extra["drifted_turns"] for c in calls] == [0] * 4
  for prev, cur in zip(calls, calls[1:]):  # Each call extends the last one's input and output.
    history = prev.input_ids + prev.output_ids
    assert cur.input_ids[:len(history)] == history
  assert tree.drift_calls == 0 and tree.leaves == 1 and set(tree.reasons.values()) == {"train"}
  assert {c.extra["harness_metadata"]["request_kind"] for c in calls} == {"turn"}
  assert len({c.extra["harness_metadata"]["thread_id"] for c in calls}) == 1


def _subagent_policy(template):
  """The root spawns a subagent that writes sub.txt, waits for it, then writes hello.txt."""
  def play(input_ids):
    prompt = decode_input(template, input_ids)
    done = prompt.count("<tool_response>")
    if "<|im_start|>user\nWrite sub.txt containing sub" in prompt:  # The subagent's own task.
      return ScriptTurn(text="Sub done.") if done else ScriptTurn(tool_calls=(_shell("printf sub > sub.txt"),))
    if done == 0:
      return ScriptTurn(text="Delegating.", tool_calls=(
          ("multi_agent_v1.spawn_agent", {"message": "Write sub.txt containing sub"}),))
    if done == 1:
      agent = re.search(r'"agent_id":"([^"]+)"', prompt).group(1)
      return ScriptTurn(tool_calls=(("multi_agent_v1.wait_agent", {"targets": [agent], "timeout_ms": 60000}),))
    if done == 2:
      return ScriptTurn(tool_calls=(_shell("printf hello > hello.txt"),))
    return ScriptTurn(text="Done.")
  return play


def test_subagent_calls_are_logged_as_subagent(template, hello_task, tmp_path):
  outcome, calls, _, tree = _run(template, hello_task, tmp_path, _subagent_policy(template))
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  assert (_workspace(outcome) / "sub.txt").read_text() == "sub"
  meta = [c.extra["harness_metadata"] for c in calls]
  sub = [c for c, m in zip(calls, meta) if m.get("thread_source") == "subagent"]
  root = [c for c, m in zip(calls, meta) if m.get("thread_source") == "user"]
  assert len(sub) == 2 and len(root) == 4 and len(sub) + len(root) == len(calls)
  assert {c.role for c in sub} == {"subagent"} and {c.role for c in root} == {"main"}
  assert {m["parent_thread_id"] for m in meta if "parent_thread_id" in m} == {root[0].extra["harness_metadata"]["thread_id"]}
  # The call that spawned it went out as a namespaced function call and came back spliced.
  assert '"name": "multi_agent_v1.spawn_agent"' in template.tokenizer.decode(list(root[0].output_ids))
  assert tree.drift_calls == 0
  assert {tree.reasons[c.call_index] for c in sub} == {"subagent"}
  assert {tree.reasons[c.call_index] for c in root} == {"train"}


def _compaction_policy(template):
  """Long tool output until Codex compacts; the summary; then the task from the summary."""
  def play(input_ids):
    prompt = decode_input(template, input_ids)
    last = _last_user(prompt)
    if "CONTEXT CHECKPOINT COMPACTION" in last or "handoff summary" in last:
      return ScriptTurn(text="Summary: listed numbers; hello.txt is still to write.")
    if "Summary: listed numbers" in prompt:
      return ScriptTurn(text="Done.") if "printf hello" in prompt else ScriptTurn(
          tool_calls=(_shell("printf hello > hello.txt"),))
    return ScriptTurn(tool_calls=(_shell(f"seq 1 {600 + prompt.count('<tool_response>')}"),))
  return play


@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_compaction_is_logged_as_compaction(template, hello_task, tmp_path, remote):
  # A 12K window compacting from 10K: the first call is ~8K tokens, two `seq` outputs pass 10K.
  options = HarnessOptions(context_window=12_000, codex_compact_reserve=2_000, codex_remote_compaction=remote)
  outcome, calls, _, tree = _run(template, hello_task, tmp_path, _compaction_policy(template), options)
  rec = outcome.record
  assert rec.status == "ok" and rec.reward == 1.0, dumps(rec.extra)
  catalog = json.loads((outcome.rollout_dir / "home" / ".codex" / "clawjax-models.json").read_text())
  assert (catalog["models"][0]["context_window"], catalog["models"][0]["auto_compact_token_limit"]) == (12_000, 10_000)
  roles = [c.role for c in calls]
  assert roles.count("compaction") == 1, roles
  k = roles.index("compaction")
  compaction = calls[k]
  assert compaction.extra["harness_metadata"]["request_kind"] == "compaction"
  assert compaction.extra["harness_metadata"]["compaction"]["implementation"] == (
      "responses_compaction_v2" if remote else "responses")
  assert len(calls[k - 1].input_ids) + len(calls[k - 1].output_ids) > 10_000
  # After it, the conversation restarts from the summary (no earlier turn to splice), with no drift.
  assert "Summary: listed numbers" in decode_input(template, calls[k + 1].input_ids)
  assert calls[k + 1].extra["spliced_turns"] == 0 and len(calls[k + 1].input_ids) < len(calls[k - 1].input_ids)
  assert tree.drift_calls == 0 and tree.reasons[k] == "compaction"
  assert all(tree.reasons[c.call_index] == "train" for c in calls if c.role == "main")
