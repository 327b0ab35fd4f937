"""Token identity: a conversation rendered by the SFT stage is, call for call and token for token, what
the shim records when a client replays the same conversation through it with the official SDK in the
harness's request shape (OpenAI with tools, as OpenClaw sends it; Anthropic with tool_use blocks, as
Claude Code sends it). The loss mask is exactly the logged outputs: every assistant turn, its tool-call
tokens and end-of-turn token included, and nothing else."""
from __future__ import annotations

import collections

import anthropic
import numpy as np
import openai
import pytest

from clawjax.calllog import load
from clawjax.sft.data import read_conversations
from clawjax.sft.render import conversation_tree, render_calls
from clawjax.text.templates import load_template
from clawjax.tree.build import build_tree

from tests.sft.helpers import (ANTHROPIC_CONVERSATION, OPENAI_CONVERSATION, replay_shim, script_turn,
                               write_jsonl)


@pytest.fixture(scope="module", params=["qwen3", "smollm2"])
def template(request):
  return load_template(request.param)


def _read_one(tmp_path, fmt, conversation):
  path = write_jsonl(tmp_path / f"{fmt}.jsonl", [conversation])
  (conv,) = read_conversations(str(path), fmt, bad_lines="stop", counts=collections.Counter())
  return conv


def _replay_openai(shim, conversation):
  rollout = shim.create_rollout("t", "openclaw")
  client = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
  raw = conversation["messages"]
  for j, m in enumerate(raw):
    if m["role"] == "assistant":
      reply = client.chat.completions.create(model="local/policy", messages=raw[:j], tools=conversation["tools"],
                                             tool_choice="auto", max_completion_tokens=8192)
      assert [c.function.name for c in reply.choices[0].message.tool_calls or []] == [
          c["function"]["name"] for c in m.get("tool_calls") or []]
  return rollout


def _replay_anthropic(shim, conversation):
  rollout = shim.create_rollout("t", "claude_code")
  client = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
  raw = conversation["messages"]
  for j, m in enumerate(raw):
    if m["role"] == "assistant":
      reply = client.messages.create(model="claude-sonnet-9", max_tokens=16000, system=conversation["system"],
                                     messages=raw[:j], tools=conversation["tools"], thinking={"type": "adaptive"})
      assert [b.type for b in reply.content if b.type == "tool_use"] == [
          b["type"] for b in m["content"] if b["type"] == "tool_use"]
  return rollout


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_rendered_calls_equal_the_calls_the_shim_records(tmp_path, template, fmt):
  conversation = OPENAI_CONVERSATION if fmt == "openai" else ANTHROPIC_CONVERSATION
  conv = _read_one(tmp_path, fmt, conversation)
  rendered = render_calls(template, conv.messages, conv.tools, rollout_id=conv.where)
  turns = [script_turn(m) for m in conv.messages if m.role == "assistant"]
  assert len(rendered) == len(turns) == 3
  with replay_shim(template, turns, tmp_path / "logs") as shim:
    rollout = (_replay_openai if fmt == "openai" else _replay_anthropic)(shim, conversation)
    shim.finish_rollout(rollout["rollout_id"])
  logged = load(rollout["log_path"]).calls[rollout["rollout_id"]]
  assert [c.status for c in logged] == ["ok"] * 3
  assert all(c.extra["drifted_turns"] == 0 for c in logged)
  for mine, theirs in zip(rendered, logged):
    assert mine.input_ids == theirs.input_ids
    assert mine.output_ids == theirs.output_ids

  # The loss mask: exactly the logged outputs, each ending with the end-of-turn token.
  tree, how = conversation_tree(conv.where, rendered, max_len=1 << 20, overlong="cut")
  assert how == "whole"
  final = logged[-1]
  assert tree.tokens_T.tolist() == list(final.input_ids + final.output_ids)
  expected = np.zeros(tree.size, bool)
  for c in logged:
    expected[len(c.input_ids):len(c.input_ids) + len(c.output_ids)] = True
    assert c.output_ids[-1] == template.stop_token_ids[0]
  np.testing.assert_array_equal(tree.owner_T >= 0, expected)
  # Every tool call's markup is trained: the 3 calls of the 2 tool turns.
  trained_text = "".join(template.tokenizer.decode(list(c.output_ids)) for c in logged)
  assert trained_text.count("<tool_call>") == trained_text.count("</tool_call>") == 3
  # The one-path tree is the tree clawjax.tree builds from the same calls, token for token (its radix
  # nodes are cut at the calls' boundaries; one path either way).
  reference = build_tree(conv.where, rendered)
  for field in ("tokens_T", "depth_T", "parent_T", "subtree_end_T", "owner_T", "logprobs_T", "paths_T"):
    np.testing.assert_array_equal(getattr(tree, field), getattr(reference, field), err_msg=field)
  assert len(tree.leaves_L) == len(reference.leaves_L) == 1
  np.testing.assert_array_equal(tree.path(int(tree.leaves_L[0])), reference.path(int(reference.leaves_L[0])))


def test_text_that_spells_control_tokens_is_trained_as_text(tmp_path):
  template = load_template("qwen3")
  conversation = {"messages": [{"role": "user", "content": "Quote the stop token."},
                               {"role": "assistant", "content": "It is <|im_end|> and <tool_call> is markup."}]}
  conv = _read_one(tmp_path, "openai", conversation)
  (call,) = render_calls(template, conv.messages, conv.tools, rollout_id=conv.where)
  out = list(call.output_ids)
  assert out.count(template.stop_token_ids[0]) == 1 and out[-1] == template.stop_token_ids[0]
  assert template.tokenizer.token_id("<tool_call>") not in out
  assert template.tokenizer.decode(out[:-1]) == "It is <|im_end|> and <tool_call> is markup."


def test_a_turn_after_the_last_assistant_turn_is_not_rendered_and_overlong_is_cut_at_a_turn(tmp_path):
  template = load_template("qwen3")
  conv = _read_one(tmp_path, "openai", dict(OPENAI_CONVERSATION, messages=OPENAI_CONVERSATION["messages"][:-2]))
  calls = render_calls(template, conv.messages, conv.tools, rollout_id=conv.where)
  assert len(calls) == 2  # the tool results after the second turn belong to no call
  first_end = len(calls[0].input_ids) + len(calls[0].output_ids)
  full = len(calls[1].input_ids) + len(calls[1].output_ids)
  cut, how = conversation_tree(conv.where, calls, max_len=full - 1, overlong="cut")
  assert how == "cut" and cut.size == first_end and (cut.owner_T >= 0).sum() == len(calls[0].output_ids)
  assert conversation_tree(conv.where, calls, max_len=full - 1, overlong="drop") == (None, "dropped")
  assert conversation_tree(conv.where, calls, max_len=first_end - 1, overlong="cut") == (None, "dropped")
