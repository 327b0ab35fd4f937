"""The dialect-neutral call: what every API parses into and renders from, and the Dialect interface."""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import orjson

from clawjax.serving.errors import ApiError
from clawjax.text.messages import Message, ParsedTurn, ToolCall, ToolSpec, random_hex
from clawjax.text.turn_stream import Delta


@dataclasses.dataclass
class ChatRequest:
  """One API request in neutral form. `client_sampling` keeps what the client asked (recorded only: the
  shim samples with its own configured temperature so the rollout distribution is known). `metadata`
  is what the client says about the call (Codex's turn metadata: its thread, agent and request kind),
  which the harness profiles read roles from. `reply` is what the dialect's response needs of the
  request beyond the neutral fields (None for most)."""
  model: str
  messages: list[Message]
  tools: list[ToolSpec]
  max_tokens: int | None
  stream: bool
  enable_thinking: bool | None = None
  include_usage: bool = False
  client_sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  reply: Any = None


@dataclasses.dataclass
class ChatResult:
  """One generated turn, ready to render. Tool calls carry ids the shim assigned."""
  turn: ParsedTurn
  input_tokens: int
  output_tokens: int
  finish_reason: str  # Generation.finish_reason: "stop" | "length" | "abort".


class MessageMemo:
  """The converted messages and tools of a rollout's previous request. A harness resends its whole
  history and tool list on every call; a message equal (deep ==, done in C) to the one at the same
  position last time reuses its conversion, and so does an equal tool list, so per-call validation work
  grows with the new messages only. Reusing the very same ToolSpec objects also lets the chat template
  reuse its key for them (`ChatTemplate.blocks`). (`convert` returns whatever `fn` converts an entry
  to: Messages, or a dialect's pieces of them.)"""

  def __init__(self):
    self._entries: list[tuple[Any, list[Any]]] = []
    self._tools: tuple[Any, list[ToolSpec]] | None = None

  def convert(self, raw: list[Any], fn: Callable[[Any, int], list[Any]]) -> list[Any]:
    out, entries = [], []
    for i, m in enumerate(raw):
      hit = i < len(self._entries) and self._entries[i][0] == m
      converted = self._entries[i][1] if hit else fn(m, i)
      entries.append((m, converted))
      out.extend(converted)
    self._entries = entries
    return out

  def convert_tools(self, raw: Any, fn: Callable[[Any], list[ToolSpec]]) -> list[ToolSpec]:
    if self._tools is None or self._tools[0] != raw:
      self._tools = (raw, fn(raw))
    return self._tools[1]


def new_id(prefix: str) -> str:
  return prefix + random_hex(12)


def parse_arguments(raw: str) -> dict[str, Any] | str:
  """Tool-call arguments as a client sent them (a JSON string): the object, or the string verbatim when
  it is not a JSON object (kept, so nothing the harness or the model wrote is lost)."""
  try:
    parsed = json.loads(raw)
  except ValueError:
    return raw
  return parsed if isinstance(parsed, dict) else raw


def arguments_json(call: ToolCall) -> str:
  """A tool call's arguments as the JSON string the OpenAI APIs carry."""
  return call.arguments if isinstance(call.arguments, str) else dumps(call.arguments)


def dumps(obj: Any) -> str:
  """Compact JSON, UTF-8 characters unescaped. orjson (~10x faster on a turn's events) refuses integers
  beyond 64 bits and non-string keys, which a model's tool arguments can hold: those take `json`."""
  try:
    return orjson.dumps(obj).decode()
  except TypeError:  # (orjson.JSONEncodeError is a TypeError)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(data: Any, event: str | None = None) -> bytes:
  """One server-sent event; `data` is JSON-encoded unless it is already a string."""
  payload = data if isinstance(data, str) else dumps(data)
  head = f"event: {event}\n" if event else ""
  return f"{head}data: {payload}\n\n".encode()


class TurnEvents(abc.ABC):
  """The event stream of one streamed call, built as it goes: `head` once the stream opens, `keepalive`
  while nothing else is due, `deltas` while the engine samples (thinking and text as the turn parser
  settles them), `rest` for the remainder once the turn is parsed, then `final` once its record is on
  disk, or `error` in its place. Streamed text is always a prefix of the parsed turn's (one parser makes
  both), so the remainder is what follows it. Without deltas, `rest` is the whole turn."""

  def __init__(self, message_id: str, model: str, request: ChatRequest):
    self.message_id, self.model, self.request = message_id, model, request
    self.sent = {"thinking": 0, "text": 0}  # Characters streamed so far, by kind.

  def deltas(self, deltas: list[Delta]) -> bytes:
    return b"".join(self._delta(d.kind, d.text) for d in deltas)

  def rest(self, result: ChatResult) -> bytes:
    """Every remaining event of the turn except the final one."""
    out = [self._delta(kind, full[self.sent[kind]:])
           for kind, full in (("thinking", result.turn.thinking or ""), ("text", result.turn.text))
           if len(full) > self.sent[kind]]
    return b"".join(out) + self._end(result)

  def _delta(self, kind: str, text: str) -> bytes:
    self.sent[kind] += len(text)
    return self._piece(kind, text)

  @abc.abstractmethod
  def head(self, input_tokens: int) -> bytes:
    """Events sent before generation finishes (may be empty)."""

  @abc.abstractmethod
  def keepalive(self) -> bytes:
    """An event that keeps the connection alive while generating, which clients ignore."""

  @abc.abstractmethod
  def _piece(self, kind: str, text: str) -> bytes:
    """The events of one piece of thinking or text."""

  @abc.abstractmethod
  def _end(self, result: ChatResult) -> bytes:
    """Tool calls, stop reason and usage, after all text."""

  @abc.abstractmethod
  def final(self) -> bytes:
    """The last event; sent only after the call record is on disk."""

  @abc.abstractmethod
  def error(self, err: ApiError) -> bytes:
    """An error after the stream began (its status already sent), in place of `final`."""


class Dialect(abc.ABC):
  """One API's wire format. Stateless; the server owns the call flow."""
  name: str
  tool_id_prefix: str
  message_id_prefix: str  # Of the response's id.
  overloaded_status: int  # What an overloaded (retryable) backend is answered with.

  @abc.abstractmethod
  def parse_request(self, body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Validates and converts a decoded body; raises ApiError(invalid_request) naming the field."""

  @abc.abstractmethod
  def response(self, result: ChatResult, request: ChatRequest, model: str, message_id: str
               ) -> dict[str, Any]:
    """The non-streaming response body."""

  @abc.abstractmethod
  def turn_events(self, message_id: str, model: str, request: ChatRequest) -> TurnEvents:
    """The events of a streamed call."""

  @abc.abstractmethod
  def error_body(self, err: ApiError) -> dict[str, Any]:
    """The API's JSON error shape."""
