"""Harness text never becomes control tokens, driven by the official `anthropic` and `openai` SDKs.

Every added token of the vocabulary (Qwen3's 26 under its own template, SmolLM2's 17 under chatml) is
written into every content field of both dialects: system prompts, user text, an earlier assistant turn
as a harness echoes it (text, thinking, tool calls' names and arguments, parsed and verbatim), tool
results (string, blocks, errors), and the tools' names, descriptions and schemas. The same
conversation with harmless text in those fields is the reference: the call log's added-token ids must
be exactly the reference's (the ones the template places), and the logged prompt must decode to the
forged text verbatim.
"""
import json

import anthropic
import openai
import pytest

from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.text.templates import load_template

from tests.serving.helpers import log_calls

REPLY = ScriptTurn(text="Writing it.", tool_calls=(("write_file", {"path": "a.txt", "content": "hi"}),))
FINAL = ScriptTurn(text="Done.")
HARMLESS = "plain words"


@pytest.fixture(scope="module")
def smollm2_template():
  return load_template("smollm2")


@pytest.fixture(params=["qwen3", "smollm2"])
def chat_template(request, template, smollm2_template):
  return {"qwen3": template, "smollm2": smollm2_template}[request.param]


def _spelled(chat_template) -> str:
  """Every added token of the vocabulary, run together and apart."""
  tokens = sorted(chat_template.tokenizer.added_tokens)
  assert len(tokens) in (26, 17)
  return "".join(tokens) + " " + " ".join(tokens)


def _anthropic_calls(shim, s: str) -> tuple[list, int]:
  """Two Messages calls with `s` in every content field; (the logged calls, count_tokens of the first)."""
  rollout = shim.create_rollout("task", "claude-code")
  c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
  tools = [{"name": "write_file", "description": f"Write a file. {s}",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string", "description": s},
                                                              "content": {"type": "string"}}}},
           {"name": f"tool {s}", "description": s,
            "input_schema": {"type": "object", "properties": {s: {"type": "string", "enum": [s]}}}}]
  system = [{"type": "text", "text": s}, {"type": "text", "text": f"Be brief. {s}"}]
  messages = [
      {"role": "user", "content": s},
      {"role": "system", "content": f"Environment: {s}"},
      {"role": "user", "content": [{"type": "text", "text": f"Look at {s}"}, {"type": "text", "text": s}]},
      {"role": "assistant", "content": [
          {"type": "thinking", "thinking": f"I think {s}", "signature": "sig"},
          {"type": "text", "text": f"Earlier {s}"},
          {"type": "tool_use", "id": "toolu_1", "name": f"tool {s}", "input": {s: s, "n": [s]}}]},
      {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": s},
          {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
           "content": [{"type": "text", "text": f"failed: {s}"}]}]},
  ]
  kwargs = dict(model="m", max_tokens=1000, system=system, tools=tools)
  counted = c.messages.count_tokens(model="m", system=system, tools=tools, messages=messages).input_tokens
  reply = c.messages.create(messages=messages, **kwargs)
  assert reply.content[-1].type == "tool_use"
  messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[-1].id,
                                             "content": s}]}]
  with c.messages.stream(messages=messages, **kwargs) as stream:
    assert stream.get_final_message().content[0].text == FINAL.text
  return log_calls(rollout["log_path"]), counted


def _openai_calls(shim, s: str) -> tuple[list, None]:
  """Two Chat Completions calls with `s` in every content field; (the logged calls, None)."""
  rollout = shim.create_rollout("task", "openclaw")
  c = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
  tools = [{"type": "function", "function": {
      "name": "write_file", "description": f"Write a file. {s}",
      "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": s},
                                                      "content": {"type": "string"}}}}},
           {"type": "function", "function": {"name": f"tool {s}", "description": s,
                                             "parameters": {"type": "object", "properties": {s: {}}}}}]
  messages = [
      {"role": "system", "content": s},
      {"role": "developer", "content": [{"type": "text", "text": f"Be brief. {s}"}]},
      {"role": "user", "content": s},
      {"role": "user", "content": [{"type": "text", "text": f"Look at {s}"}]},
      {"role": "assistant", "content": f"Earlier {s}", "reasoning_content": f"I think {s}", "tool_calls": [
          {"id": "call_1", "type": "function", "function": {"name": f"tool {s}", "arguments": json.dumps({s: s})}},
          {"id": "call_2", "type": "function", "function": {"name": s, "arguments": f'{{"not json {s}'}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": s},
      {"role": "tool", "tool_call_id": "call_2", "name": s, "content": [{"type": "text", "text": f"x {s}"}]},
  ]
  reply = c.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
  assert reply.tool_calls
  messages += [reply.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": s}]
  final = c.chat.completions.create(model="m", messages=messages, tools=tools).choices[0].message
  assert final.content == FINAL.text
  return log_calls(rollout["log_path"]), None


@pytest.mark.parametrize("dialect", [_anthropic_calls, _openai_calls], ids=["anthropic", "openai"])
def test_spelled_control_tokens_in_every_field_stay_text(make_shim, chat_template, dialect):
  tok = chat_template.tokenizer
  backend = ScriptedBackend(chat_template, lambda ids: FINAL if REPLY.text in tok.decode(ids) else REPLY)
  shim = make_shim(None, backend=backend, chat_template=chat_template)
  spelled = _spelled(chat_template)
  forged, forged_count = dialect(shim, spelled)
  harmless, harmless_count = dialect(shim, HARMLESS)
  added_ids = set(tok.added_tokens.values())
  assert [c.status for c in forged] == [c.status for c in harmless] == ["ok", "ok"]
  for f, h in zip(forged, harmless):
    placed = [i for i in h.input_ids if i in added_ids]
    assert placed.count(tok.token_id("<|im_start|>")) >= 6  # blocks of the reference conversation
    assert [i for i in f.input_ids if i in added_ids] == placed
    assert f.output_ids == h.output_ids  # the same scripted turns
    assert tok.decode(f.input_ids).replace(spelled, HARMLESS) == tok.decode(h.input_ids)
    assert tok.decode(f.input_ids).count(spelled) >= 10
    # The earlier assistant turn was re-rendered (drift); the model's own reply was spliced back.
    assert (f.extra["drifted_turns"], h.extra["drifted_turns"]) == (1, 1)
  # The second call extends the first: what the model saw is one token path.
  assert forged[1].input_ids[:len(forged[0].input_ids)] == forged[0].input_ids
  if forged_count is not None:
    assert (forged_count, harmless_count) == (len(forged[0].input_ids), len(harmless[0].input_ids))
