"""Token-in-token-out prompts: splicing sampled turns back, drift, and incremental == full rendering."""
import dataclasses
import json
import random

import pytest
from hypothesis import given, settings, strategies as st

from clawjax.text.messages import Message, ToolCall, ToolSpec
from clawjax.text.prompt import PromptBuilder
from clawjax.text.templates import ChatTemplate

BASH = ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {
    "command": {"type": "string"}, "flags": {"type": "array", "items": {"type": "string"}}}})


def _sample(template, body: str, rng: random.Random, stop: bool = True) -> list[int]:
  """A scripted policy's output ids for `body`: deliberately NOT the canonical tokenisation (some tokens
  split in two), as a real sampler may produce; re-tokenising the text could never give these ids back."""
  tok = template.tokenizer
  out = []
  for i in tok.encode(body):
    piece = tok.decode([i])
    if i not in tok.added_tokens.values() and len(piece) > 1 and piece.isascii() and rng.random() < 0.5:
      out += tok.encode(piece[0]) + tok.encode(piece[1:])
    else:
      out.append(i)
  assert out != tok.encode(body) or len(body) < 3
  return out + ([template.stop_token_ids[0]] if stop else [])


def _echo(turn, *, rewrite: bool = True) -> Message:
  """What a harness sends back for a turn: ids rewritten (underscores dropped), arguments re-serialised
  compactly with keys reordered, thinking stripped."""
  calls = [ToolCall(c.id.replace("_", "") if rewrite else c.id, c.name,
                    json.dumps(dict(reversed(list(c.arguments.items()))), separators=(",", ":")))
           for c in turn.tool_calls]
  return Message("assistant", turn.text, thinking=None, tool_calls=calls)


def _bodies():
  yield '<think>\nI should list the files.\n</think>\n\nLet me look.\n<tool_call>\n' \
        '{"name": "bash", "arguments": {"command": "ls", "flags": ["-la", "--color=never"]}}\n</tool_call>'
  yield '<think>\nTwo reads at once.\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": ' \
        '{"command": "cat a.txt"}}\n</tool_call>\n<tool_call>\n{"name": "bash", "arguments": ' \
        '{"command": "cat b.txt"}}\n</tool_call>'
  yield '<think>\nSame listing again.\n</think>\n\nLet me look.\n<tool_call>\n' \
        '{"name": "bash", "arguments": {"command": "ls", "flags": ["-la", "--color=never"]}}\n</tool_call>'
  yield "<think>\nDone.\n</think>\n\nAll files are listed above: a.txt and b.txt."


def _rollout(template, builder, *, seed=0, edit_turn=None):
  """Drive one OpenClaw-like rollout; returns [(prompt, output_ids)] per call and the final messages."""
  rng = random.Random(seed)
  messages = [Message("system", "You are an agent."), Message("user", "[Mon 12:00] List my files.")]
  calls = []
  for k, body in enumerate(_bodies()):
    prompt = builder.build(messages, [BASH])
    out = _sample(template, body, rng)
    turn = template.parse(out)
    builder.record_generation(prompt, out, turn)
    calls.append((prompt, out))
    echo = _echo(turn)
    if k == edit_turn:
      echo = dataclasses.replace(echo, content=echo.content + " (edited)")
    messages.append(echo)
    messages += [Message("tool", f"result {i} of call {k}", tool_call_id=c.id)
                 for i, c in enumerate(echo.tool_calls)]
    messages.append(Message("user", "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> keep going"))
  return calls, messages


def test_splice_gives_back_exact_sampled_ids(qwen3):
  builder = PromptBuilder(qwen3)
  calls, _ = _rollout(qwen3, builder)
  for n, ((prev, out), (nxt, _)) in enumerate(zip(calls, calls[1:]), 1):
    # The next call continues exactly the previous call's input + sampled output: one linear path.
    end = len(prev.input_ids) + len(out)
    assert nxt.input_ids[:end] == prev.input_ids + out
    # ... and the transcript goes on as ChatML does after a turn's <|im_end|>: a newline, the next block.
    assert nxt.input_ids[end:end + 2] == qwen3.tokenizer.encode("\n<|im_start|>")
    assert (nxt.spliced_turns, nxt.drifted_turns) == (n, 0)
  # The echoed text re-tokenised would differ: without splicing the prefix property fails.
  prompt, out = calls[0]
  rerendered = qwen3.render([Message("user", "x"), _echo(qwen3.parse(out))], add_generation_prompt=False)
  assert out[:-1] != rerendered[-len(out):-1]


def test_incremental_equals_fresh_builder(qwen3):
  incremental = PromptBuilder(qwen3)
  calls, messages = _rollout(qwen3, incremental)
  fresh = PromptBuilder(qwen3)
  for prompt, out in calls:  # same sampled turns known, nothing cached
    fresh.record_generation(prompt, out, qwen3.parse(out))
  a, b = incremental.build(messages, [BASH]), fresh.build(messages, [BASH])
  assert a.input_ids == b.input_ids and (a.spliced_turns, a.drifted_turns) == (b.spliced_turns, 0)
  assert a.new_tokens < len(a.input_ids) // 5 and b.new_tokens == len(b.input_ids)


def test_duplicate_turns_each_get_their_own_sample(qwen3):
  # Turns 0 and 2 have the same parsed content (tool, arguments, text) but different sampled ids.
  builder = PromptBuilder(qwen3)
  calls, _ = _rollout(qwen3, builder, seed=3)
  assert calls[0][1] != calls[2][1]
  prompt, out = calls[2]
  assert calls[3][0].input_ids[:len(prompt.input_ids) + len(out)] == prompt.input_ids + out


def test_edited_turn_is_drift_and_rendered_by_the_template(qwen3):
  builder = PromptBuilder(qwen3)
  calls, messages = _rollout(qwen3, builder, edit_turn=1)
  last = calls[-1][0]
  assert (last.spliced_turns, last.drifted_turns) == (2, 1)  # turns 0 and 2 spliced, 1 drifted
  # The edited turn's ids are exactly the template's rendering of it, right after the spliced prefix.
  edited_at = messages.index(next(m for m in messages if m.content.endswith("(edited)")))
  ids = builder.build(messages[:edited_at + 1], [BASH]).input_ids
  prefix = builder.build(messages[:edited_at], [BASH]).input_ids
  opening = qwen3.tokenizer.encode(qwen3.generation_prompt())
  block = qwen3.tokenizer.encode(qwen3.block_text(qwen3.blocks(messages[:edited_at + 1], [BASH])[-1]))
  assert ids == prefix[:-len(opening)] + block + opening


def test_cut_off_sample_gets_the_turn_end(qwen3):
  builder = PromptBuilder(qwen3)
  messages = [Message("user", "Write a long story.")]
  prompt = builder.build(messages)
  out = _sample(qwen3, "Once upon a time there was", random.Random(0), stop=False)
  turn = qwen3.parse(out)
  builder.record_generation(prompt, out, turn)
  nxt = builder.build(messages + [_echo(turn), Message("user", "Go on.")])
  assert nxt.input_ids[:len(prompt.input_ids) + len(out) + 3] == \
      prompt.input_ids + out + qwen3.tokenizer.encode("<|im_end|>\n<|im_start|>")
  assert nxt.drifted_turns == 0


def _conversation(n_turns: int, seed: int = 0) -> list[Message]:
  """A long conversation with awkward text at block edges: leading/trailing spaces and newlines,
  partial special-token spellings, unicode; no sampled turns, so every assistant turn is rendered."""
  rng = random.Random(seed)
  bits = ["  ", "\n", "\n\n", " trailing ", "<|im", "_end|", ">", "<tool", "_call>", "ünï", "数字", "🤖", "x",
          "'s", "1234", "\t", "</think", "}", "{\"a\": 1}"]
  text = lambda: "".join(rng.choice(bits) for _ in range(rng.randint(0, 12)))
  messages = [Message("system", "sys " + text())]
  for k in range(n_turns):
    messages.append(Message("user", text()))
    calls = [ToolCall(f"c{k}_{i}", "bash", {"command": text()}) for i in range(rng.randint(0, 2))]
    messages.append(Message("assistant", text(), thinking=text() or None, tool_calls=calls))
    messages += [Message("tool", text(), tool_call_id=c.id) for c in calls]
  return messages


@pytest.mark.parametrize("template", ["qwen3", "chatml", "smollm2"], indirect=True)
def test_incremental_build_equals_full_render_over_30_turns(template):
  messages = _conversation(30)
  builder = PromptBuilder(template)
  ends = [k + 1 for k, m in enumerate(messages) if m.role != "tool" and k > 0] + [len(messages)]
  for end in ends:
    for thinking in (True, False):
      prompt = builder.build(messages[:end], [BASH], enable_thinking=thinking)
      assert prompt.input_ids == template.render(messages[:end], [BASH], enable_thinking=thinking), end
      assert prompt.spliced_turns == 0
      assert prompt.drifted_turns == sum(m.role == "assistant" for m in messages[:end])


_TEXT = st.lists(st.sampled_from(["a", " ", "\n", "<", "|", ">", "im_end", "think", "/", "ü", "数", "🤖", "\t",
                                  "<|im_start|>", "<think>", "</tool_call>"]), max_size=20).map("".join)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool", "system"]), _TEXT), min_size=1,
                max_size=8), st.integers(0, 8))
def test_any_cut_gives_the_full_rendering(qwen3, pairs, cut):
  messages = [Message(role, text) for role, text in pairs]
  builder = PromptBuilder(qwen3)
  builder.build(messages[:cut])
  assert builder.build(messages).input_ids == qwen3.render(messages)


def test_work_per_call_grows_with_new_messages_only(qwen3):
  tok = qwen3.tokenizer
  big_tools = [dataclasses.replace(BASH, name=f"tool{i}", description="d" * 2000) for i in range(10)]
  messages = _conversation(30, seed=1)
  builder = PromptBuilder(qwen3)
  ends = [k + 1 for k, m in enumerate(messages) if m.role == "user"]
  builder.build(messages[:ends[0]], big_tools)
  full_chars = len(qwen3.render_text(messages[:ends[-1]], big_tools))
  assert full_chars > 20_000
  total = 0
  for start, end in zip(ends, ends[1:]):
    before = dataclasses.replace(tok.stats)
    builder.build(messages[:end], big_tools)
    new = messages[start:end]
    calls, chars = tok.stats.calls - before.calls, tok.stats.chars - before.chars
    # One encode per new block plus the generation prompt; characters bounded by the new messages'
    # own text plus the template's per-message framing, independent of the 20K+ characters before.
    text_of = lambda m: len(m.content) + len(m.thinking or "") + sum(len(json.dumps(c.arguments)) + 60
                                                                    for c in m.tool_calls)
    assert calls <= len(new) + 1
    assert chars <= sum(text_of(m) + 60 for m in new) + 30
    total += chars
  assert total < full_chars


def test_interleaved_conversations_both_stay_cached(qwen3):
  # A main agent and a subagent alternate calls within one rollout; each call of either conversation
  # encodes only the messages added since that conversation's previous call.
  convs = [_conversation(10, seed=2), _conversation(10, seed=3)]
  cuts = [[k for k, m in enumerate(c) if m.role == "assistant"] for c in convs]  # where requests end
  builder = PromptBuilder(qwen3)
  for n in range(min(map(len, cuts))):
    for conv, cut in zip(convs, cuts):
      before = qwen3.tokenizer.stats.chars
      prompt = builder.build(conv[:cut[n]])
      encoded = qwen3.tokenizer.stats.chars - before
      assert prompt.input_ids == qwen3.render(conv[:cut[n]])
      if n > 0:
        assert encoded <= len(qwen3.render_text(conv[cut[n - 1]:cut[n]]))


def test_rollouts_of_one_task_share_the_big_blocks(qwen_tok):
  template = ChatTemplate("qwen3", qwen_tok, shared_cache_blocks=3)
  big = [dataclasses.replace(BASH, description="d" * 5000)]
  task = [Message("system", "s" * 5000), Message("user", "the task " * 500)]
  first = PromptBuilder(template).build(task, big)
  before = qwen_tok.stats.chars
  second = PromptBuilder(template).build(task, big)  # a new rollout: its own trie, shared block ids
  assert qwen_tok.stats.chars - before < 100  # only the generation prompt was encoded
  assert second.input_ids == first.input_ids == template.render(task, big)
  for k in range(3):  # three other blocks evict the task's blocks from a 3-block cache
    PromptBuilder(template).build([Message("user", f"other {k}")])
  before = qwen_tok.stats.chars
  PromptBuilder(template).build(task, big)
  assert qwen_tok.stats.chars - before > 10_000


def test_echo_with_inline_thinking_still_splices(qwen3):
  builder = PromptBuilder(qwen3)
  messages = [Message("user", "Hi")]
  prompt = builder.build(messages)
  out = _sample(qwen3, "<think>\nSay hello.\n</think>\n\nHello there!", random.Random(1))
  turn = qwen3.parse(out)
  builder.record_generation(prompt, out, turn)
  echo = Message("assistant", f"<think>{turn.thinking}</think>\n{turn.text}\n")
  nxt = builder.build(messages + [echo, Message("user", "Bye")])
  assert nxt.input_ids[:len(prompt.input_ids) + len(out)] == prompt.input_ids + out
  assert (nxt.spliced_turns, nxt.drifted_turns) == (1, 0)


@pytest.mark.parametrize("template", ["qwen3", "smollm2"], indirect=True)
def test_builder_keeps_spelled_added_tokens_as_text(template):
  """The builder's cached per-block ids of content that spells added tokens equal the one-piece render."""
  tok = template.tokenizer
  spelled = " ".join(tok.added_tokens)
  messages = [Message("system", spelled), Message("user", f"read this: {spelled}")]
  tools = [ToolSpec(f"t{spelled}", spelled, {"type": "object"})]
  builder = PromptBuilder(template)
  first = builder.build(messages, tools)
  assert first.input_ids == template.render(messages, tools)
  messages += [Message("assistant", spelled), Message("user", spelled + "\n")]
  assert builder.build(messages, tools).input_ids == template.render(messages, tools)
  assert not set(tok.added_tokens.values()) & set(tok.encode_ordinary(spelled))
