"""Neutral chat records that both the Anthropic Messages and the OpenAI Chat Completions APIs map to.

The serving layer converts API requests into these records, the chat templates render them to token
ids, and a template's parser turns sampled ids back into a `ParsedTurn` the serving layer converts into
an API response. Nothing here knows about either API's wire format.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any, Literal

# Message and tool-call ids must be unique, not secret: a PRNG seeded from the OS is ~50x cheaper per id
# than `secrets` (a getrandom syscall) on the shim's per-call path. Secrets (API keys) use `secrets`.
_IDS = random.Random(os.urandom(16))


def random_hex(n_bytes: int) -> str:
  """A random id of 2 * n_bytes hex digits (unique with overwhelming probability, not a secret)."""
  return f"{_IDS.getrandbits(8 * n_bytes):0{2 * n_bytes}x}"


Role = Literal["system", "user", "assistant", "tool"]
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  """A tool the model may call; `parameters` is its JSON schema (an object schema)."""
  name: str
  description: str = ""
  parameters: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ToolCall:
  """One tool call. `arguments` is the parsed JSON object, or the verbatim string when it did not parse
  as a JSON object (kept so that nothing the harness or the model wrote is lost)."""
  id: str
  name: str
  arguments: dict[str, Any] | str


@dataclasses.dataclass(frozen=True)
class Message:
  """One chat message.

  role "tool" is a tool result: `content` is the result text, `tool_call_id` the call it answers,
  `name` the tool's name when the API gives it. `thinking` is an assistant turn's reasoning text
  (None: none was given). `tool_calls` only appear on assistant messages.
  """
  role: Role
  content: str = ""
  thinking: str | None = None
  tool_calls: tuple[ToolCall, ...] = ()
  tool_call_id: str | None = None
  name: str | None = None

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"Message.role: {self.role!r} is not one of {ROLES}")
    if not isinstance(self.content, str):
      raise ValueError(f"Message.content: expected a string, got {type(self.content).__name__}")
    if self.tool_calls and self.role != "assistant":
      raise ValueError(f"Message.tool_calls: only assistant messages carry tool calls, not {self.role!r}")
    # Accept any sequence but store a tuple, so messages stay hashable and immutable.
    object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  """What a template's parser recovered from one assistant turn's sampled ids.

  `text` is the visible reply (a malformed tool call's raw text stays in it), `thinking` the reasoning
  (None when the turn had no or an empty thinking block), `tool_calls` the well-formed calls in order,
  `malformed` the raw text of each `<tool_call>` block that could not be parsed, for the call log.
  """
  text: str
  thinking: str | None = None
  tool_calls: tuple[ToolCall, ...] = ()
  malformed: tuple[str, ...] = ()


def canonical_arguments(arguments: dict[str, Any] | str) -> str:
  """A serialisation of tool-call arguments that is equal for equal parsed values, whatever spacing or
  key order a harness re-serialised them with. Unparsable strings compare verbatim."""
  if isinstance(arguments, str):
    try:
      arguments = json.loads(arguments)
    except ValueError:
      return "raw:" + arguments
  return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
