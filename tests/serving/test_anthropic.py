"""The Anthropic Messages dialect, driven by the official `anthropic` SDK."""
import json

import anthropic
import pytest

from clawjax.serving.backends.scripted import scripted_logprob, turn_ids
from clawjax.text.messages import Message, ToolSpec

from tests.serving.helpers import FINAL_TURN, READ_TURN, WRITE_TURN, assert_linear_zero_drift, log_calls, post

TOOLS = [
    {"name": "write_file", "description": "Write a file.", "cache_control": {"type": "ephemeral"},
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"},
                                                       "content": {"type": "string"}}}},
    {"name": "read_file", "description": "Read a file.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "deferred", "description": "Loaded later.", "defer_loading": True,
     "input_schema": {"type": "object"}},
]
SYSTEM = [{"type": "text", "text": "You are a coding agent."},
          {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]


def client(rollout):
  return anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)


def tool_loop(c, stream, n_calls=3):
  """Runs a Claude Code-shaped loop: echo each turn back unchanged, answer tools with tool_result."""
  messages = [{"role": "user", "content": [{"type": "text", "text": "Write a.txt, then read it."}]},
              {"role": "system", "content": "Environment: linux, cwd /work."}]
  replies = []
  for _ in range(n_calls):
    kwargs = dict(model="claude-sonnet-9", max_tokens=32000 if stream else 16000, system=SYSTEM,
                  messages=messages,
                  tools=TOOLS, thinking={"type": "adaptive"}, metadata={"user_id": "u"},
                  extra_body={"context_management": {"edits": []}, "output_config": {"x": 1}})
    if stream:
      with c.beta.messages.stream(**kwargs, betas=["fancy-beta-2099"]) as s:
        reply = s.get_final_message()
    else:
      reply = c.messages.create(**kwargs)
    replies.append(reply)
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                      for b in reply.content]})
    results = [{"type": "tool_result", "tool_use_id": b.id, "cache_control": {"type": "ephemeral"},
                "content": [{"type": "text", "text": "ok"}]} for b in reply.content
               if b.type == "tool_use"]
    if results:
      messages.append({"role": "user", "content": results})
  return replies


@pytest.mark.parametrize("stream", [True, False])
def test_three_call_tool_loop_logs_one_linear_path(make_shim, template, stream):
  shim = make_shim([WRITE_TURN, READ_TURN, FINAL_TURN])
  rollout = shim.create_rollout("task-1", "claude_code")
  replies = tool_loop(client(rollout), stream)

  first = replies[0]
  assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
  assert first.content[0].thinking == WRITE_TURN.thinking
  assert first.content[1].text == WRITE_TURN.text
  assert (first.content[2].name, first.content[2].input) == WRITE_TURN.tool_calls[0]
  assert first.content[2].id.startswith("toolu_")
  assert first.stop_reason == "tool_use"
  assert replies[1].content[0].input == {"path": "a.txt"}
  assert replies[2].stop_reason == "end_turn" and replies[2].content[0].text == FINAL_TURN.text

  calls = assert_linear_zero_drift(rollout["log_path"], 3)
  # Independent reference: the first prompt rendered from scratch by the template.
  expected_prompt = template.render(
      [Message("system", "You are a coding agent.\nBe brief."),
       Message("user", "Write a.txt, then read it."),
       Message("system", "Environment: linux, cwd /work.")],
      [ToolSpec("write_file", "Write a file.", TOOLS[0]["input_schema"]),
       ToolSpec("read_file", "Read a file.", TOOLS[1]["input_schema"])], enable_thinking=True)
  assert list(calls[0].input_ids) == expected_prompt
  for call, turn in zip(calls, [WRITE_TURN, READ_TURN, FINAL_TURN]):
    assert list(call.output_ids) == turn_ids(template, turn)
    assert list(call.output_logprobs) == pytest.approx(
        [scripted_logprob(len(call.input_ids) + i, t) for i, t in enumerate(call.output_ids)])
    assert call.role == "main" and call.status == "ok" and call.finish_reason == "stop"
    assert call.policy_version == 0 and call.harness == "claude_code" and call.task_id == "task-1"
    assert call.extra["api"] == "anthropic" and call.extra["max_new_tokens"] == 8192
  assert [c.extra["spliced_turns"] for c in calls] == [0, 1, 2]
  assert replies[0].usage.input_tokens == len(calls[0].input_ids)
  assert replies[0].usage.output_tokens == len(calls[0].output_ids)


def test_raw_stream_events_and_pings(make_shim, template):
  """Event order of a streamed tool_use turn, with keep-alive pings while the backend works."""
  from clawjax.serving.backends.scripted import ScriptedBackend
  backend = ScriptedBackend(template, [WRITE_TURN], latency_s=0.35)
  shim = make_shim(None, backend=backend, keepalive_s=0.1)
  rollout = shim.create_rollout("t", "claude_code")
  body = dict(model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}],
              tools=TOOLS[:1], stream=True)
  status, text = post(rollout["base_url"] + "/v1/messages?beta=true", body, rollout["api_key"])
  assert status == 200
  events = [line[len("event: "):] for line in text.splitlines() if line.startswith("event: ")]
  assert events[0] == "message_start" and events[-1] == "message_stop"
  assert events.count("ping") >= 2
  body = [e for e in events if e != "ping"]
  assert body == ["message_start"] + ["content_block_start", "content_block_delta",
                                      "content_block_stop"] * 3 + ["message_delta", "message_stop"]
  deltas = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
  tool_json = next(d["delta"]["partial_json"] for d in deltas
                   if d.get("delta", {}).get("type") == "input_json_delta")
  assert json.loads(tool_json) == WRITE_TURN.tool_calls[0][1]


def test_openclaw_style_rewritten_echo_is_spliced(make_shim, template):
  """Tool ids rewritten, arguments re-serialised, thinking dropped: still zero drift."""
  shim = make_shim([WRITE_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "openclaw")
  c = client(rollout)
  messages = [{"role": "user", "content": "Write a.txt"}]
  first = c.messages.create(model="m", max_tokens=500, messages=messages, tools=TOOLS)
  tool = first.content[-1]
  new_id = tool.id.replace("_", "")
  messages += [{"role": "assistant", "content": [
      {"type": "text", "text": WRITE_TURN.text},
      {"type": "tool_use", "id": new_id, "name": tool.name,
       "input": dict(reversed(list(tool.input.items())))}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": new_id,
                                             "content": "written", "is_error": False}]}]
  c.messages.create(model="m", max_tokens=500, messages=messages, tools=TOOLS)
  calls = assert_linear_zero_drift(rollout["log_path"], 2)
  assert calls[1].extra["spliced_turns"] == 1


def test_edited_turn_counts_as_drift(make_shim):
  shim = make_shim([WRITE_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  c = client(rollout)
  messages = [{"role": "user", "content": "Write a.txt"}]
  first = c.messages.create(model="m", max_tokens=500, messages=messages, tools=TOOLS)
  tool = first.content[-1]
  messages += [{"role": "assistant", "content": [
      {"type": "text", "text": "An edited reply."},
      {"type": "tool_use", "id": tool.id, "name": tool.name, "input": tool.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool.id,
                                             "content": "boom", "is_error": True}]}]
  c.messages.create(model="m", max_tokens=500, messages=messages, tools=TOOLS)
  calls = log_calls(rollout["log_path"])
  assert calls[1].extra["drifted_turns"] == 1 and calls[1].extra["spliced_turns"] == 0


def test_count_tokens_matches_template_render(make_shim, template):
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  c = client(rollout)
  got = c.messages.count_tokens(model="m", system="Be brief.", tools=TOOLS[:1],
                                messages=[{"role": "user", "content": "hello"}])
  expected = template.render([Message("system", "Be brief."), Message("user", "hello")],
                             [ToolSpec("write_file", "Write a file.", TOOLS[0]["input_schema"])])
  assert got.input_tokens == len(expected)
  assert log_calls(rollout["log_path"]) == []


def test_max_tokens_caps_and_length_stop_reason(make_shim, template):
  shim = make_shim([WRITE_TURN], max_new_tokens=5)
  rollout = shim.create_rollout("t", "claude_code")
  reply = client(rollout).messages.create(model="m", max_tokens=16000, tools=TOOLS,
                                          messages=[{"role": "user", "content": "go"}])
  assert reply.stop_reason == "max_tokens"
  (call,) = log_calls(rollout["log_path"])
  assert list(call.output_ids) == turn_ids(template, WRITE_TURN)[:5]
  assert call.finish_reason == "length" and call.extra["max_new_tokens"] == 5


def test_malformed_tool_call_comes_back_as_text_and_is_logged(make_shim):
  from clawjax.serving.backends.scripted import ScriptTurn
  bad = '<tool_call>\n{"name": "write_file", "arguments": {broken\n</tool_call>'
  shim = make_shim([ScriptTurn(text="Trying. " + bad)])
  rollout = shim.create_rollout("t", "claude_code")
  reply = client(rollout).messages.create(model="m", max_tokens=500, tools=TOOLS,
                                          messages=[{"role": "user", "content": "go"}])
  assert [b.type for b in reply.content] == ["text"] and bad in reply.content[0].text
  assert reply.stop_reason == "end_turn"
  (call,) = log_calls(rollout["log_path"])
  assert call.extra["malformed_tool_calls"] == [bad]


def test_changed_tools_mid_rollout_reach_the_prompt(make_shim, template):
  # The shim reuses a rollout's converted tools while the harness resends them unchanged; a changed
  # tool list (an MCP server connecting mid-run) must still be what the model sees.
  from clawjax.serving.anthropic_api import parse_messages
  shim = make_shim([FINAL_TURN, FINAL_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  body = {"model": "m", "max_tokens": 50, "system": SYSTEM, "tools": TOOLS,
          "messages": [{"role": "user", "content": "hi"}]}
  changed = [dict(TOOLS[0], description="Write a file (v2)."), TOOLS[1]]
  for tools in (TOOLS, changed, TOOLS):
    body = dict(body, tools=tools)
    status, text = post(rollout["base_url"] + "/v1/messages", body, rollout["api_key"])
    assert status == 200, text
    req = parse_messages(json.loads(json.dumps(body)), need_max_tokens=True)
    expected = template.render(req.messages, req.tools)
    assert list(log_calls(rollout["log_path"])[-1].input_ids) == list(expected)


def test_final_event_waits_for_the_record_on_disk(make_shim):
  # The stream's body may go out while the record is written; its last event may not. A slow disk
  # (the writer sleeps before appending) makes a wrong order show: message_stop before the line.
  import time
  import urllib.request
  shim = make_shim([READ_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  writer = shim.server.registry.get(rollout["rollout_id"]).writer
  append = writer.append
  writer.append = lambda line: (time.sleep(0.5), append(line))
  body = {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
  req = urllib.request.Request(rollout["base_url"] + "/v1/messages", data=json.dumps(body).encode(),
                               headers={"content-type": "application/json", "x-api-key": rollout["api_key"]})
  seen = []
  with urllib.request.urlopen(req, timeout=60) as resp:
    for line in resp:
      if line.startswith(b"event: "):
        event = line[7:].strip().decode()
        seen.append((event, len(log_calls(rollout["log_path"]))))
  assert seen[-1] == ("message_stop", 1)
  assert ("content_block_start", 0) in seen  # The body did go out before the record was on disk.


@pytest.mark.parametrize("stream", [True, False])
def test_tool_input_beyond_64_bit_integers_and_unicode_reaches_the_client(make_shim, stream):
  # The events are encoded with orjson, which refuses integers past 64 bits: those turns take `json`.
  from clawjax.serving.backends.scripted import ScriptTurn
  args = {"path": "café/ü.txt", "content": "naïve ✓", "seed": 2**70, "ratio": 0.1}
  shim = make_shim([ScriptTurn(text="Writing.", tool_calls=(("write_file", args),))])
  rollout = shim.create_rollout("t", "claude_code")
  kwargs = dict(model="m", max_tokens=500, tools=TOOLS, messages=[{"role": "user", "content": "go"}])
  if stream:
    with client(rollout).messages.stream(**kwargs) as s:
      reply = s.get_final_message()
  else:
    reply = client(rollout).messages.create(**kwargs)
  (tool_use,) = [b for b in reply.content if b.type == "tool_use"]
  assert tool_use.input == args
