"""The streaming turn parser: deltas fed in any chunking add up to exactly the parsed turn, which matches
an independent regex reading of the grammar (clawjax/text/turn_stream.py)."""
import json
import random
import re

import pytest
from hypothesis import given, settings, strategies as st

from clawjax.text.messages import ParsedTurn
from clawjax.text.turn_stream import TurnParser, split_thinking


def reference(text: str) -> tuple[str, str | None, list[tuple[str, dict]], list[str]]:
  """(text, thinking, calls, malformed) of a turn's decoded text, read with regexes."""
  thinking, rest = None, text
  m = re.fullmatch(r"<think>(.*?)(?:</think>(.*)|)", text, re.S)
  if m:
    thinking, rest = m.group(1).strip("\n") or None, m.group(2) or ""
  parts, calls, malformed, pos = [], [], [], 0
  for m in re.finditer(r"<tool_call>(.*?)(?:</tool_call>|\Z)", rest, re.S):
    parts.append(rest[pos:m.start()])
    pos = m.end()
    call = None
    if m.group(0).endswith("</tool_call>"):
      try:
        body = json.loads(m.group(1))
        args = body.get("arguments", {}) if isinstance(body, dict) else None
        args = json.loads(args) if isinstance(args, str) else args
        if isinstance(body.get("name"), str) and body["name"] and isinstance(args, dict):
          call = (body["name"], args)
      except (ValueError, AttributeError):
        pass
    if call is None:
      malformed.append(m.group(0))
      parts.append(m.group(0))
    else:
      calls.append(call)
  parts.append(rest[pos:])
  return "".join(parts).strip(), thinking, calls, malformed


def summary(turn: ParsedTurn):
  return turn.text, turn.thinking, [(c.name, c.arguments) for c in turn.tool_calls], list(turn.malformed)


PIECES = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<", "</", "<tool_", "think>", "\n", " ",
          "\n\n", "\t", "Hello", "wörld 数字", "😀", "{", "}", '"', "<|im_end|>",
          '{"name": "bash", "arguments": {"command": "ls -la"}}',
          '{"name": "read", "arguments": "{\\"path\\": \\"a\\"}"}', '{"name": "x", "arguments": [1]}',
          '{"arguments": {}}', '{"name": "bash", "arguments": {"c']


def _byte_token_ids(tokenizer, text: str) -> list[int]:
  """One token per UTF-8 byte: byte-level BPE's vocabulary spells byte b as one printable character
  (printable Latin-1 bytes as themselves, the others as U+0100 onwards, in order)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
  others = [b for b in range(256) if b not in printable]
  char = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
  return [tokenizer.token_id(char[b]) for b in text.encode()]


def _split(rng: random.Random, ids: list[int]) -> list[list[int]]:
  chunks, i = [], 0
  while i < len(ids):
    n = rng.choice([1, 1, 1, 2, 3, 7, 50])
    chunks.append(ids[i:i + n])
    i += n
  return chunks


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=14).map("".join), st.integers(0, 2**32),
       st.booleans(), st.booleans())
def test_streamed_deltas_add_up_to_the_parse_and_match_the_reference(qwen3, text, seed, stopped,
                                                                     by_byte):
  # by_byte: tags spelled by ordinary tokens too (a model can), so they also arrive in pieces.
  ids = _byte_token_ids(qwen3.tokenizer, text) if by_byte else qwen3.tokenizer.encode(text)
  ids += [qwen3.stop_token_ids[0]] if stopped else []
  stream = qwen3.turn_stream()
  deltas = [d for chunk in _split(random.Random(seed), ids) for d in stream.feed(chunk)]
  last, turn = stream.finish()
  deltas += last
  kinds = [d.kind for d in deltas]
  assert kinds == sorted(kinds, key=["thinking", "text"].index)  # All thinking first.
  assert "".join(d.text for d in deltas if d.kind == "text") == turn.text
  assert "".join(d.text for d in deltas if d.kind == "thinking") == (turn.thinking or "")
  assert all(d.text for d in deltas)
  turn_ids = list(ids)
  while turn_ids and turn_ids[-1] in qwen3.stop_token_ids:  # Trailing end-of-turn ids are not the turn.
    turn_ids.pop()
  decoded = qwen3.tokenizer.decode(turn_ids)
  assert summary(turn) == reference(decoded)
  assert summary(qwen3.parse(ids)) == summary(turn)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([p for p in PIECES if "tool_call" not in p and "{" not in p]),
                max_size=12).map("".join))
def test_echoed_inline_thinking_is_read_as_the_turn_was_parsed(text):
  # A harness that writes a turn's thinking back inline gets the reading the parser gave the turn, so
  # the echo matches the sampled turn.
  parser = TurnParser()
  parser.push(text, final=True)
  turn = parser.turn()
  thinking, rest = split_thinking(text)
  assert (turn.thinking, turn.text) == (thinking or None, rest.strip())


def test_text_streams_before_the_turn_ends_and_holds_only_what_may_change(qwen3):
  parser = TurnParser()
  assert parser.push("<thi") == []  # May still open a think block.
  assert parser.push("nk>\n\nLet me") == [("thinking", "Let me")]
  assert parser.push(" see.\n</thi") == [("thinking", " see.")]  # Newline may be trailing; tag unsure.
  assert parser.push("nk>\n\nFirst,") == [("text", "First,")]
  assert parser.push(" a call <tool_") == [("text", " a call")]
  assert parser.push('call>{"name": "ls", "arguments": {}}') == []  # Held until it closes.
  assert parser.push("</tool_call> then <tool_call>{bad}</tool_call>") == [
      ("text", "  then"), ("text", " <tool_call>{bad}</tool_call>")]  # (The space held before the call.)
  assert parser.push(" end. \n") == [("text", " end.")]
  assert parser.end() == []
  turn = parser.turn()
  assert (turn.thinking, turn.text) == ("Let me see.", "First, a call  then <tool_call>{bad}</tool_call> end.")
  assert [c.name for c in turn.tool_calls] == ["ls"] and turn.malformed == ("<tool_call>{bad}</tool_call>",)


def test_a_turn_not_opening_with_think_has_no_thinking(qwen3):
  # The grammar decides thinking from the turn's first characters, so text can stream.
  ids = qwen3.tokenizer.encode("Plan.</think>Answer")
  assert qwen3.parse(ids) == ParsedTurn("Plan.</think>Answer")


@pytest.mark.parametrize("text", ["é", "数字", "😀", "a😀b"])
def test_a_character_split_across_tokens_is_sent_whole(qwen3, text):
  ids = _byte_token_ids(qwen3.tokenizer, text)
  assert len(ids) == len(text.encode()) and qwen3.tokenizer.decode(ids) == text
  stream = qwen3.turn_stream()
  deltas = [d for i in ids for d in stream.feed([i])]
  deltas += stream.finish()[0]
  assert "\ufffd" not in "".join(d.text for d in deltas)
  assert "".join(d.text for d in deltas) == text
