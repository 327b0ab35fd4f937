"""The OpenAI Chat Completions dialect, driven by the official `openai` SDK."""
import json

import openai
import pytest

from clawjax.serving.backends.scripted import turn_ids
from clawjax.text.messages import Message, ToolCall, ToolSpec

from tests.serving.helpers import FINAL_TURN, READ_TURN, WRITE_TURN, assert_linear_zero_drift, log_calls

TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                    "content": {"type": "string"}}}}},
         {"type": "function", "function": {
             "name": "read_file", "description": "Read a file.",
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


def client(rollout):
  return openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"],
                       max_retries=0)


def run_stream(c, **kwargs):
  """Reassembles a streamed completion the way an agent does; returns (message dict, finish, usage)."""
  text, thinking, calls, finish, usage = "", "", {}, None, None
  for chunk in c.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                         **kwargs):
    if chunk.usage is not None:
      usage = chunk.usage
    for choice in chunk.choices:
      d = choice.delta
      text += d.content or ""
      thinking += getattr(d, "reasoning_content", None) or ""
      for tc in d.tool_calls or []:
        slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
        slot["id"] += tc.id or ""
        slot["name"] += tc.function.name or ""
        slot["arguments"] += tc.function.arguments or ""
      finish = choice.finish_reason or finish
  return text, thinking, [calls[i] for i in sorted(calls)], finish, usage


@pytest.mark.parametrize("stream", [True, False])
def test_three_call_tool_loop_logs_one_linear_path(make_shim, template, stream):
  shim = make_shim([WRITE_TURN, READ_TURN, FINAL_TURN])
  rollout = shim.create_rollout("task-2", "openclaw")
  c = client(rollout)
  messages = [{"role": "system", "content": "You are an agent."},
              {"role": "user", "content": [{"type": "text", "text": "Write a.txt, then read it."}]}]
  finishes = []
  for _ in range(3):
    kwargs = dict(model="local/policy", messages=messages, tools=TOOLS, tool_choice="auto",
                  max_completion_tokens=8192)
    if stream:
      text, _, calls, finish, usage = run_stream(c, **kwargs)
      assert usage is not None and usage.completion_tokens > 0
    else:
      r = c.chat.completions.create(**kwargs)
      m = r.choices[0].message
      text, finish = m.content or "", r.choices[0].finish_reason
      calls = [{"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
               for t in m.tool_calls or []]
    finishes.append(finish)
    # OpenClaw's echo: ids without underscores, compact re-serialised arguments, no reasoning.
    messages.append({"role": "assistant", "content": text or None, "tool_calls": [
        {"id": t["id"].replace("_", ""), "type": "function",
         "function": {"name": t["name"], "arguments": json.dumps(json.loads(t["arguments"]),
                                                                 separators=(",", ":"))}}
        for t in calls] or None})
    for t in calls:
      messages.append({"role": "tool", "tool_call_id": t["id"].replace("_", ""), "content": "ok"})
    if calls:
      messages.append({"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> note"})
    if finish == "tool_calls":
      assert json.loads(calls[0]["arguments"]) in ({"path": "a.txt", "content": "hello"},
                                                   {"path": "a.txt"})
      assert calls[0]["id"].startswith("call_")
  assert finishes == ["tool_calls", "tool_calls", "stop"]
  assert text == FINAL_TURN.text
  logged = assert_linear_zero_drift(rollout["log_path"], 3)
  expected = template.render([Message("system", "You are an agent."),
                              Message("user", "Write a.txt, then read it.")],
                             [ToolSpec(t["function"]["name"], t["function"]["description"],
                                       t["function"]["parameters"]) for t in TOOLS])
  assert list(logged[0].input_ids) == expected
  assert [list(c.output_ids) for c in logged] == [turn_ids(template, t)
                                                  for t in (WRITE_TURN, READ_TURN, FINAL_TURN)]
  assert all(c.extra["api"] == "openai" and c.role == "main" for c in logged)


def test_models_lists_the_served_model(make_shim):
  shim = make_shim([FINAL_TURN], model_name="policy-7")
  rollout = shim.create_rollout("t", "openclaw")
  assert [m.id for m in client(rollout).models.list()] == ["policy-7"]


def test_non_object_arguments_are_kept_verbatim_as_drift(make_shim, template):
  """A harness that mangles arguments into non-JSON: the turn is re-rendered, counted as drift."""
  shim = make_shim([WRITE_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "openclaw")
  c = client(rollout)
  messages = [{"role": "user", "content": "go"}]
  r = c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
  call = r.choices[0].message.tool_calls[0]
  messages += [{"role": "assistant", "content": r.choices[0].message.content,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.function.name, "arguments": "{broken"}}]},
               {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
  c.chat.completions.create(model="m", messages=messages, tools=TOOLS)
  second = log_calls(rollout["log_path"])[1]
  assert second.extra["drifted_turns"] == 1
  rendered = template.render([Message("user", "go"),
                              Message("assistant", WRITE_TURN.text, tool_calls=[
                                  ToolCall(call.id, call.function.name, "{broken")]),
                              Message("tool", "ok", tool_call_id=call.id)],
                             [ToolSpec(t["function"]["name"], t["function"]["description"],
                                       t["function"]["parameters"]) for t in TOOLS])
  assert list(second.input_ids) == rendered
