"""One sampled assistant turn, parsed while it is generated: token ids in, thinking and text deltas out,
and at the end the `ParsedTurn`. `ChatTemplate.parse` runs the same machine over a finished turn, so
what a client was streamed is always exactly what the turn parses to.

The turn's grammar (Qwen3's output format; SmolLM2's chatml writes the same tool calls, no thinking):

  turn     := [ "<think>" thinking ( "</think>" | end ) ] text
  text     := ( chars | "<tool_call>" body ( "</tool_call>" | end ) )*

* Thinking is the part between the turn's opening `<think>` and the first `</think>`, with its leading
  and trailing newlines removed; empty thinking is None. A turn that does not begin with `<think>` has
  no thinking, whatever it contains later: deciding that from the first characters is what lets text
  stream before the turn ends.
* Each `<tool_call>` body must be a JSON object with a string `name` and an object `arguments` (or a
  string holding one); anything else, or a block cut off before `</tool_call>`, stays in the text
  verbatim and is listed in `malformed`. Tool calls get fresh ids (the model writes none).
* The text is everything else, with leading and trailing whitespace removed.
* Trailing end-of-turn tokens are not part of the turn.

Streaming holds back only what later characters could still change: an unfinished `<think>`,
`</think>` or `<tool_call>` tag, a tool call until it closes (well-formed calls are not text; malformed
ones are), whitespace that may turn out to be trailing, and bytes of an unfinished UTF-8 character.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Literal, NamedTuple

from clawjax.text.messages import ParsedTurn, ToolCall, random_hex

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


class Delta(NamedTuple):
  """A piece of the turn's thinking or visible text, in order; all thinking comes before any text."""
  kind: Literal["thinking", "text"]
  text: str


def split_thinking(text: str) -> tuple[str | None, str]:
  """The grammar's thinking rule on a whole text: (thinking, the rest), thinking None unless the text
  opens with `<think>`. For assistant content a harness sends back with its thinking written inline,
  read as the parser read the turn it came from."""
  if not text.startswith(THINK_OPEN):
    return None, text
  thinking, _, rest = text[len(THINK_OPEN):].partition(THINK_CLOSE)
  return thinking.strip("\n"), rest.lstrip("\n")


def parse_tool_call(body: str, id_prefix: str) -> ToolCall | None:
  """The call in one `<tool_call>` body, or None when it is malformed."""
  try:
    obj = json.loads(body)
  except ValueError:
    return None
  if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
    return None
  args = obj.get("arguments", {})
  if isinstance(args, str):
    try:
      args = json.loads(args)
    except ValueError:
      return None
  if not isinstance(args, dict):
    return None
  return ToolCall(id_prefix + random_hex(12), obj["name"], args)


def _partial_tag(s: str, tag: str) -> int:
  """Length of the longest suffix of `s` that is a proper prefix of `tag` (what may still become it)."""
  for n in range(min(len(s), len(tag) - 1), 0, -1):
    if s.endswith(tag[:n]):
      return n
  return 0


class _Trimmed:
  """Emits a string piece by piece without its leading and trailing `chars` (None: whitespace), as
  str.strip would: trailing ones are held until something else follows them."""

  def __init__(self, kind: Literal["thinking", "text"], chars: str | None):
    self.kind, self.chars = kind, chars
    self.parts: list[str] = []
    self.held = ""

  def add(self, s: str, out: list[Delta]) -> None:
    s = self.held + s
    if not self.parts:
      s = s.lstrip(self.chars)
    body = s.rstrip(self.chars)
    self.held = s[len(body):]
    if body:
      self.parts.append(body)
      out.append(Delta(self.kind, body))

  def value(self) -> str:
    return "".join(self.parts)


def _settle(buf: str, tag: str, sink: _Trimmed, out: list[Delta], final: bool) -> tuple[bool, str]:
  """Adds to `sink` the text of `buf` before `tag` (all of it if there is no `tag`, except an ending
  that may still become one); returns whether `tag` was found, and the rest of `buf`, from `tag` on."""
  i = buf.find(tag)
  if i < 0:
    i = len(buf) - (0 if final else _partial_tag(buf, tag))
  sink.add(buf[:i], out)
  return buf.startswith(tag, i), buf[i:]


class TurnParser:
  """The grammar above over a turn's text as it grows: `push(text)` returns the deltas it settles,
  `end()` the last ones; then `turn()` is the ParsedTurn."""

  def __init__(self, id_prefix: str = "call_"):
    self.id_prefix = id_prefix
    self._phase: Literal["start", "thinking", "text"] = "start"
    self._buf = ""  # Text not settled yet.
    self._thinking = _Trimmed("thinking", "\n")
    self._text = _Trimmed("text", None)
    self._calls: list[ToolCall] = []
    self._malformed: list[str] = []

  def push(self, text: str, *, final: bool = False) -> list[Delta]:
    out: list[Delta] = []
    buf = self._buf + text
    while True:
      if self._phase == "start":
        if buf.startswith(THINK_OPEN):
          buf, self._phase = buf[len(THINK_OPEN):], "thinking"
        elif not final and THINK_OPEN.startswith(buf):
          break  # "", "<", "<th", ...: may still open a think block.
        else:
          self._phase = "text"
      elif self._phase == "thinking":
        found, buf = _settle(buf, THINK_CLOSE, self._thinking, out, final)
        if not found:
          break
        buf, self._phase = buf[len(THINK_CLOSE):], "text"
      else:
        found, buf = _settle(buf, CALL_OPEN, self._text, out, final)
        if not found:
          break
        j = buf.find(CALL_CLOSE, len(CALL_OPEN))
        if j < 0 and not final:
          break  # Held until it closes or the turn ends.
        end = len(buf) if j < 0 else j + len(CALL_CLOSE)
        call = None if j < 0 else parse_tool_call(buf[len(CALL_OPEN):j], self.id_prefix)
        if call is None:
          self._malformed.append(buf[:end])
          self._text.add(buf[:end], out)
        else:
          self._calls.append(call)
        buf = buf[end:]
    self._buf = buf
    return out

  def end(self) -> list[Delta]:
    return self.push("", final=True)

  def turn(self) -> ParsedTurn:
    return ParsedTurn(self._text.value(), self._thinking.value() or None, tuple(self._calls),
                      tuple(self._malformed))


class TurnStream:
  """Token ids of one turn -> deltas and the ParsedTurn. Ids are decoded incrementally: decoding the
  ids since the last complete character gives exactly the text they add to the whole turn's decode
  (byte-level BPE), so each id is decoded about once. End-of-turn ids are held until another id
  follows them: only trailing ones are dropped."""

  def __init__(self, decode: Callable[[Sequence[int]], str], stop_token_ids: Collection[int],
               id_prefix: str = "call_"):
    self._decode, self._stop = decode, frozenset(stop_token_ids)
    self._parser = TurnParser(id_prefix)
    self._pending: list[int] = []  # Ids not decoded yet: an unfinished character, or stop ids.

  def _before_stop_ids(self) -> int:
    """How many pending ids come before the trailing end-of-turn ones."""
    n = len(self._pending)
    while n and self._pending[n - 1] in self._stop:
      n -= 1
    return n

  def feed(self, ids: Sequence[int]) -> list[Delta]:
    self._pending += ids
    n = self._before_stop_ids()
    if not n:
      return []
    text = self._decode(self._pending[:n])
    if text.endswith("\ufffd"):
      return []  # An unfinished UTF-8 character (or invalid bytes, settled by the next character).
    del self._pending[:n]
    return self._parser.push(text)

  def finish(self) -> tuple[list[Delta], ParsedTurn]:
    """The last deltas and the whole turn."""
    n = self._before_stop_ids()
    out = self._parser.push(self._decode(self._pending[:n]) if n else "", final=True)
    self._pending = []
    return out, self._parser.turn()
