"""The OpenAI Responses dialect (POST /v1/responses), driven by the official `openai` SDK:
`client.responses.create` and `client.responses.stream`, the output items fed back as the next input
the way the SDK's users and Codex do."""
import json

import openai
import pytest

from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn, turn_ids
from clawjax.serving.openai_responses import (COMPACTION_PROMPT, COMPACTION_SUMMARY_PREFIX, opaque,
                                              read_opaque)
from clawjax.text.messages import Message, ToolCall, ToolSpec

from tests.serving.helpers import (FINAL_TURN, READ_TURN, WRITE_TURN, assert_linear_zero_drift, log_calls,
                                   log_size, post)

FUNCTIONS = [
    {"type": "function", "name": "write_file", "description": "Write a file.", "strict": False,
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                     "content": {"type": "string"}}}},
    {"type": "function", "name": "read_file", "description": "Read a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}]
NAMESPACE = {"type": "namespace", "name": "agents", "description": "Subagents.", "tools": [
    {"type": "function", "name": "spawn", "description": "Start a subagent.",
     "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}}]}
# Codex's tool list has these beside its functions: hosted, so left out of the prompt.
HOSTED = [{"type": "web_search", "external_web_access": True}, {"type": "custom", "name": "apply_patch"}]
TOOLS = FUNCTIONS + [NAMESPACE] + HOSTED
TOOL_SPECS = [ToolSpec(t["name"], t["description"], t["parameters"]) for t in FUNCTIONS] + [
    ToolSpec("agents.spawn", "Start a subagent.", NAMESPACE["tools"][0]["parameters"])]
INPUT = [{"role": "developer", "content": "You are a coding agent."},
         {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Write a.txt."}]}]
BODY = {"model": "m", "input": "hi"}


def client(rollout, retries=0):
  return openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=retries)


def codex_metadata(**fields):
  """The body field Codex 0.169 carries its turn metadata in (a JSON string)."""
  meta = {"thread_id": "t-root", "agent_name": "/root", "request_kind": "turn", "thread_source": "user",
          "window_id": "t-root:0", "sandbox": "none", **fields}
  return {"x-codex-turn-metadata": json.dumps(meta)}


def respond(c, stream, **kwargs):
  """(response, event types) of one call; a stream is read whole through the SDK's accumulator."""
  if not stream:
    return c.responses.create(**kwargs), []
  with c.responses.stream(**kwargs) as s:
    types = [event.type for event in s]
    return s.get_final_response(), types


def tool_loop(c, stream, turns=3, tools=TOOLS, **extra):
  """Codex's loop: every output item goes back as input, each function call answered."""
  items, replies = list(INPUT), []
  for _ in range(turns):
    reply, types = respond(c, stream, model="policy", input=items, tools=tools, store=False,
                           include=["reasoning.encrypted_content"], parallel_tool_calls=True,
                           reasoning={"summary": "auto"}, **extra)
    replies.append((reply, types))
    items += reply.output
    items += [{"type": "function_call_output", "call_id": o.call_id, "output": "ok"}
              for o in reply.output if o.type == "function_call"]
  return replies


@pytest.mark.parametrize("stream", [False, True])
def test_three_call_tool_loop_logs_one_linear_path(make_shim, template, stream):
  shim = make_shim([WRITE_TURN, READ_TURN, FINAL_TURN])
  rollout = shim.create_rollout("task-3", "codex")
  replies = tool_loop(client(rollout), stream)

  first = replies[0][0]
  assert [o.type for o in first.output] == ["reasoning", "message", "function_call"]
  reasoning, message, call = first.output
  assert reasoning.content[0].text == WRITE_TURN.thinking
  assert read_opaque(reasoning.encrypted_content)["thinking"] == WRITE_TURN.thinking
  assert message.content[0].text == first.output_text == WRITE_TURN.text
  assert (call.name, json.loads(call.arguments)) == WRITE_TURN.tool_calls[0]
  assert call.call_id.startswith("call_") and call.namespace is None
  assert first.status == "completed" and first.id.startswith("resp_")
  assert [o.type for o in replies[1][0].output] == ["function_call"]
  assert replies[2][0].output_text == FINAL_TURN.text

  calls = assert_linear_zero_drift(rollout["log_path"], 3)
  assert [c.extra["spliced_turns"] for c in calls] == [0, 1, 2]
  for (reply, _), logged in zip(replies, calls):
    assert reply.usage.input_tokens == len(logged.input_ids)
    assert reply.usage.output_tokens == len(logged.output_ids)
    assert reply.usage.total_tokens == len(logged.input_ids) + len(logged.output_ids)
  # Independent reference: the first prompt rendered from scratch; the namespace's function flattened,
  # the hosted tools left out.
  expected = template.render([Message("system", "You are a coding agent."), Message("user", "Write a.txt.")],
                             TOOL_SPECS)
  assert list(calls[0].input_ids) == expected
  assert [list(c.output_ids) for c in calls] == [turn_ids(template, t) for t in (WRITE_TURN, READ_TURN, FINAL_TURN)]
  assert all(c.extra["api"] == "responses" and c.role == "main" for c in calls)
  if stream:
    types = replies[0][1]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-1] == "response.completed"
    for kind in ("response.reasoning_text.delta", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.content_part.done",
                 "response.function_call_arguments.delta", "response.function_call_arguments.done"):
      assert kind in types, kind
    assert types.count("response.output_item.added") == types.count("response.output_item.done") == 3


def test_stream_events_carry_sequence_numbers_and_the_items_of_the_body(make_shim):
  """The raw stream: numbered events, items added then done in order, and response.completed holding
  the same output as the non-streamed answer to the same request."""
  shim = make_shim([WRITE_TURN, WRITE_TURN])
  rollout = shim.create_rollout("t", "codex")
  body = {"model": "m", "input": INPUT, "tools": FUNCTIONS, "include": ["reasoning.encrypted_content"]}
  status, text = post(rollout["openai_base_url"] + "/responses", dict(body, stream=True), rollout["api_key"])
  assert status == 200
  events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
  names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
  assert names == [e["type"] for e in events]
  assert [e["sequence_number"] for e in events] == list(range(len(events)))
  done = [e for e in events if e["type"] == "response.output_item.done"]
  assert [e["output_index"] for e in done] == [0, 1, 2]
  completed = events[-1]["response"]
  assert completed["status"] == "completed" and completed["output"] == [e["item"] for e in done]
  status, text = post(rollout["openai_base_url"] + "/responses", body, rollout["api_key"])
  plain = json.loads(text)["output"]
  strip = lambda items: [{k: v for k, v in i.items() if k not in ("id", "call_id", "encrypted_content")}
                         for i in items]
  assert strip(plain) == strip(completed["output"])


def test_namespace_call_goes_out_with_its_namespace_and_comes_back_spliced(make_shim, template):
  spawn = ScriptTurn(text="", tool_calls=(("agents.spawn", {"message": "count"}),))
  shim = make_shim([spawn, FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  (first, _), _ = tool_loop(client(rollout), stream=True, turns=2)
  (call,) = first.output
  assert (call.type, call.namespace, call.name) == ("function_call", "agents", "spawn")
  calls = assert_linear_zero_drift(rollout["log_path"], 2)
  assert calls[1].extra["spliced_turns"] == 1


def test_echo_without_item_ids_still_groups_turns(make_shim):
  """A client that drops item ids and reasoning (only message and function_call kept): each turn is
  still found, spliced, so there is no drift."""
  shim = make_shim([WRITE_TURN, READ_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  c = client(rollout)
  items = list(INPUT)
  for _ in range(3):
    reply = c.responses.create(model="m", input=items, tools=TOOLS)
    for o in reply.output:
      if o.type == "message":
        items.append({"role": "assistant", "content": o.content[0].text})
      elif o.type == "function_call":
        items += [{"type": "function_call", "call_id": o.call_id, "name": o.name, "arguments": o.arguments},
                  {"type": "function_call_output", "call_id": o.call_id, "output": "ok"}]
  assert_linear_zero_drift(rollout["log_path"], 3)


def test_reasoning_read_back_from_encrypted_content_only(make_shim, template):
  """The turn's thinking comes back from encrypted_content when the client keeps no `content`; the
  rendered turn (a drifted one, re-rendered) shows it as the model wrote it."""
  shim = make_shim([WRITE_TURN, FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  c = client(rollout)
  reply = c.responses.create(model="m", input=INPUT, tools=TOOLS, include=["reasoning.encrypted_content"])
  reasoning, message, call = reply.output
  changed = json.dumps({"path": "b.txt"})  # The harness altered the call: no splice, a re-render.
  items = INPUT + [{"type": "reasoning", "id": reasoning.id, "summary": [],
                    "encrypted_content": reasoning.encrypted_content},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text",
                                                                         "text": message.content[0].text}]},
                   {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": changed},
                   {"type": "function_call_output", "call_id": call.call_id, "output": "ok"}]
  c.responses.create(model="m", input=items, tools=TOOLS)
  second = log_calls(rollout["log_path"])[1]
  assert second.extra["drifted_turns"] == 1
  expected = template.render(
      [Message("system", "You are a coding agent."), Message("user", "Write a.txt."),
       Message("assistant", WRITE_TURN.text, thinking=WRITE_TURN.thinking,
               tool_calls=[ToolCall(call.call_id, "write_file", {"path": "b.txt"})]),
       Message("tool", "ok", tool_call_id=call.call_id)], TOOL_SPECS)
  assert list(second.input_ids) == expected


@pytest.mark.parametrize("metadata,role", [
    ({}, "main"),
    ({"request_kind": "compaction", "compaction": {"implementation": "responses"}}, "compaction"),
    ({"thread_id": "t-sub", "thread_source": "subagent", "parent_thread_id": "t-root",
      "subagent_kind": "thread_spawn"}, "subagent"),
    ({"request_kind": "memory"}, "auxiliary")])
def test_codex_turn_metadata_gives_the_role(make_shim, metadata, role):
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  client(rollout).responses.create(model="m", input=INPUT, tools=TOOLS, store=False,
                                   extra_body={"client_metadata": codex_metadata(**metadata)})
  (call,) = log_calls(rollout["log_path"])
  assert call.role == role
  kept = call.extra["harness_metadata"]
  assert kept["thread_id"] == metadata.get("thread_id", "t-root") and "window_id" not in kept


def test_compaction_trigger_answers_one_compaction_item_read_back_next_call(make_shim, template):
  summary = ScriptTurn(text="Wrote a.txt; nothing left.")
  shim = make_shim([WRITE_TURN, summary, FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  c = client(rollout)
  (first, _), = tool_loop(c, stream=False, turns=1)
  history = INPUT + [o.model_dump(exclude_none=True) for o in first.output] + [
      {"type": "function_call_output", "call_id": first.output[-1].call_id, "output": "ok"}]
  meta = {"client_metadata": codex_metadata(request_kind="compaction")}
  reply, types = respond(c, True, model="m", input=history + [{"type": "compaction_trigger"}], tools=TOOLS,
                         extra_body=meta)
  (item,) = reply.output
  assert item.type == "compaction" and read_opaque(item.encrypted_content) == {"summary": summary.text}
  assert types.count("response.output_item.done") == 1 and "response.output_text.delta" not in types
  compacted = INPUT + [item.model_dump(exclude_none=True)]
  assert c.responses.create(model="m", input=compacted, tools=TOOLS).output_text == FINAL_TURN.text

  calls = log_calls(rollout["log_path"])
  assert [x.role for x in calls] == ["main", "compaction", "main"]
  # The compaction call: the conversation (its turn spliced), then the shim's request for a summary.
  tail = "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n" + (
      f"<|im_start|>user\n{COMPACTION_PROMPT}<|im_end|>\n<|im_start|>assistant\n")
  history = calls[0].input_ids + calls[0].output_ids
  assert calls[1].input_ids[:len(history)] == history and calls[1].extra["spliced_turns"] == 1
  assert template.tokenizer.decode(list(calls[1].input_ids[len(history):])) == "\n" + tail
  assert list(calls[2].input_ids) == template.render(
      [Message("system", "You are a coding agent."), Message("user", "Write a.txt."),
       Message("user", COMPACTION_SUMMARY_PREFIX + summary.text)], TOOL_SPECS)


def test_a_cut_generation_completes_as_incomplete(make_shim):
  shim = make_shim([WRITE_TURN])
  rollout = shim.create_rollout("t", "codex")
  c = client(rollout)
  for stream in (False, True):
    reply, types = respond(c, stream, model="m", input=INPUT, tools=TOOLS, max_output_tokens=5)
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert not stream or types[-1] == "response.completed"
  assert [len(x.output_ids) for x in log_calls(rollout["log_path"])] == [5, 5]


def test_keepalives_are_in_progress_events(make_shim, template):
  backend = ScriptedBackend(template, [FINAL_TURN], latency_s=0.3)
  shim = make_shim(None, backend=backend, keepalive_s=0.05)
  rollout = shim.create_rollout("t", "codex")
  reply, types = respond(client(rollout), True, model="m", input=INPUT)
  assert reply.output_text == FINAL_TURN.text
  assert types.count("response.in_progress") > 2 and types[0] == "response.created"


BAD = [
    ("previous response", dict(BODY, previous_response_id="resp_1"), "previous_response_id"),
    ("no input", {"model": "m", "input": []}, "input"),
    ("bad role", dict(BODY, input=[{"role": "robot", "content": "x"}]), "input.0.role"),
    ("call without name", dict(BODY, input=[{"type": "function_call", "call_id": "c", "arguments": "{}"}]),
     "input.0.name"),
    ("output not text", dict(BODY, input=[{"type": "function_call_output", "call_id": "c", "output": 5}]),
     "input.0.output"),
    ("trigger not last", dict(BODY, input=[{"type": "compaction_trigger"}, {"role": "user", "content": "x"}]),
     "input"),
    ("foreign compaction", dict(BODY, input=[{"type": "compaction", "encrypted_content": "gAAAA"},
                                             {"role": "user", "content": "x"}]), "input.0.encrypted_content"),
    ("item reference", dict(BODY, input=[{"type": "item_reference", "id": "msg_1"}]), "input.0.type"),
    ("assistant last", dict(BODY, input=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]),
     "input"),
    ("tool without type", dict(BODY, tools=[{"name": "f"}]), "tools.0.type"),
    ("bad part", dict(BODY, input=[{"role": "user", "content": [{"type": "input_text", "text": 1}]}]),
     "input.0.content.0.text"),
]


@pytest.mark.parametrize("name,body,field", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_400_naming_the_field_and_writes_nothing(make_shim, tmp_path, name, body, field):
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  with pytest.raises(openai.BadRequestError) as e:
    client(rollout).responses.create(**body)
  assert e.value.body["param"] == field and e.value.body["type"] == "invalid_request_error", e.value.body
  assert log_size(tmp_path / "logs") == 0


def test_unknown_items_and_foreign_reasoning_are_accepted(make_shim, template):
  """A real OpenAI reasoning item (opaque to the shim) and hosted tools' items: read as nothing."""
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "codex")
  items = INPUT + [{"type": "web_search_call", "id": "ws_1", "status": "completed",
                    "action": {"type": "search", "query": "x"}},
                   {"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": "gAAAAB-not-ours"},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hm."}]},
                   {"role": "user", "content": "go on"}]
  client(rollout).responses.create(model="m", input=items)
  (call,) = log_calls(rollout["log_path"])
  assert list(call.input_ids) == template.render(
      [Message("system", "You are a coding agent."), Message("user", "Write a.txt."), Message("assistant", "Hm."),
       Message("user", "go on")])


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long_is_context_length_exceeded(make_shim, tmp_path, stream):
  shim = make_shim([FINAL_TURN], max_context=64)
  rollout = shim.create_rollout("t", "codex")
  with pytest.raises(openai.BadRequestError) as e:
    respond(client(rollout), stream, model="m", input="word " * 200)
  assert e.value.code == "context_length_exceeded" and "prompt is too long" in e.value.message
  assert log_size(tmp_path / "logs") == 0


@pytest.mark.parametrize("status,error,code", [(500, openai.InternalServerError, None),
                                               (529, openai.InternalServerError, "server_is_overloaded")])
def test_backend_failure_is_an_error_body_and_an_error_record(make_shim, template, status, error, code):
  backend = ScriptedBackend(template, [FINAL_TURN], failures={0: status})
  shim = make_shim(None, backend=backend)
  rollout = shim.create_rollout("t", "codex")
  c = client(rollout)
  with pytest.raises(error) as e:
    c.responses.create(**BODY)
  assert e.value.status_code == (503 if status == 529 else 500) and e.value.code == code
  assert c.responses.create(**BODY).output_text == FINAL_TURN.text  # The client's retry.
  calls = log_calls(rollout["log_path"])
  assert [x.status for x in calls] == ["error", "ok"] and calls[0].input_ids == calls[1].input_ids


def test_failure_after_the_stream_began_is_response_failed(make_shim, template):
  backend = ScriptedBackend(template, [FINAL_TURN], failures={0: 500}, latency_s=0.3)
  shim = make_shim(None, backend=backend, keepalive_s=0.05)
  rollout = shim.create_rollout("t", "codex")
  with client(rollout).responses.stream(**BODY) as s:
    events = list(s)
  assert events[0].type == "response.created" and events[-1].type == "response.failed"
  assert events[-1].response.status == "failed" and "backend error" in events[-1].response.error.message
  assert [x.status for x in log_calls(rollout["log_path"])] == ["error"]


def test_opaque_contents_round_trip_and_refuse_others():
  assert read_opaque(opaque({"thinking": "a\u00e9\U0001f600"})) == {"thinking": "a\u00e9\U0001f600"}
  for other in (None, 5, "gAAAAB", "clawjax1.!!!", "clawjax1." + "W10=", ""):
    assert read_opaque(other) is None
