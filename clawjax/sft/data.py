"""Trajectory readers: JSONL conversations in the OpenAI or Anthropic format, and a run's call logs.

A conversation line is converted by the shim's own dialect code (`parse_conversation` of
clawjax.serving.openai_api / anthropic_api), so its messages and tools are exactly what the shim makes of
the same request; only what a request may not do is allowed (the conversation ends with the assistant's
turn). Before that, the reader checks the format: a role, tool or content block the format does not know
(a ShareGPT "human" role, OpenAI's legacy `function_call`, a server tool) raises `FormatError` naming the
file, line and field: such a file is in another format, and skipping its lines would drop all of it.
Any other broken line (not JSON, a missing or mistyped field) raises `DataError` naming the file, line and
field, or with `bad_lines="skip"` is logged, counted (`bad_lines`) and left out.

A `calls` source is a train or eval run directory: its rollout records (the `rollout_files` globs) and
the call logs in its calls/. A rollout is trained when its status is "ok" and its reward >= min_score
(rejection-sampling fine-tuning on the model's own successful rollouts); the others are counted by why.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

from clawjax import calllog
from clawjax.calllog import CallRecord, RolloutRecord
from clawjax.serving import anthropic_api, openai_api
from clawjax.serving.errors import ApiError
from clawjax.text.messages import Message, ToolSpec

log = logging.getLogger(__name__)

FORMATS = ("openai", "anthropic")
_ROLES = {"openai": ("system", "developer", "user", "assistant", "tool"),
          "anthropic": ("system", "user", "assistant")}
_PARSERS = {"openai": openai_api.parse_conversation, "anthropic": anthropic_api.parse_conversation}
# Anthropic content blocks the shim renders; others a request may carry (images, documents) are left out
# of a user turn as the shim leaves them out, but an assistant turn must be rendered whole.
_ASSISTANT_BLOCKS = ("text", "thinking", "redacted_thinking", "tool_use")

Counts = collections.Counter


class DataError(ValueError):
  """A trajectory that cannot be read; the message names the file, line and field."""


class FormatError(DataError):
  """Data in a format the reader does not know (a role, tool or block type): it always stops the run."""


@dataclasses.dataclass(frozen=True)
class Conversation:
  """One conversation in the shim's neutral form; `where` is its file:line."""
  where: str
  messages: tuple[Message, ...]
  tools: tuple[ToolSpec, ...]


def _check_format(fmt: str, obj: dict[str, Any], where: str) -> None:
  """FormatError for what `fmt` does not know; other problems are left to the dialect's parser."""
  messages = obj.get("messages")
  for i, m in enumerate(messages if isinstance(messages, list) else []):
    if not isinstance(m, dict):
      continue
    path = f"{where}: messages.{i}"
    role = m.get("role")
    if isinstance(role, str) and role not in _ROLES[fmt]:
      raise FormatError(f"{path}.role: unknown role {role!r} in the {fmt} format (roles: {_ROLES[fmt]})")
    if fmt == "openai":
      if "function_call" in m:
        raise FormatError(f"{path}.function_call: the legacy function_call format is not read; "
                          "write assistant tool calls as tool_calls")
      for j, call in enumerate(m.get("tool_calls") or []):
        kind = call.get("type", "function") if isinstance(call, dict) else "function"
        if kind != "function":
          raise FormatError(f"{path}.tool_calls.{j}.type: unknown tool-call format {kind!r} (expected 'function')")
    elif role == "assistant" and isinstance(m.get("content"), list):
      for j, block in enumerate(m["content"]):
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind not in _ASSISTANT_BLOCKS:
          raise FormatError(f"{path}.content.{j}.type: unknown block type {kind!r} in an assistant turn "
                            f"(known: {_ASSISTANT_BLOCKS})")
  tools = obj.get("tools")
  for i, tool in enumerate(tools if isinstance(tools, list) else []):
    if not isinstance(tool, dict):
      continue
    if fmt == "openai" and (tool.get("type", "function") != "function" or not isinstance(tool.get("function"), dict)):
      raise FormatError(f"{where}: tools.{i}: unknown tool format (expected {{\"type\": \"function\", "
                        f"\"function\": {{name, description, parameters}}}}), got keys {sorted(tool)}")
    if fmt == "anthropic" and "input_schema" not in tool:
      raise FormatError(f"{where}: tools.{i}: unknown tool format (expected {{name, description, input_schema}}; "
                        f"a server tool cannot be trained), got keys {sorted(tool)}")


def load_tools(path: str, fmt: str) -> list[Any]:
  """A tools file: a JSON list of tools in the format `fmt`."""
  try:
    tools = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
  except ValueError as e:
    raise DataError(f"{path}: not JSON: {e}") from None
  if not isinstance(tools, list):
    raise DataError(f"{path}: expected a JSON list of tools, got {type(tools).__name__}")
  _check_format(fmt, {"tools": tools}, path)
  return tools


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
  with open(path, "rb") as fh:
    for lineno, line in enumerate(fh, start=1):
      if line.strip():
        yield lineno, line


def _conversation(fmt: str, line: bytes, where: str, tools: list[Any] | None) -> Conversation:
  try:
    obj = json.loads(line)
  except ValueError as e:  # (a line that is not UTF-8 too)
    raise DataError(f"{where}: not a JSON object: {e}") from None
  if not isinstance(obj, dict):
    raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
  if "tools" not in obj and tools is not None:
    obj = dict(obj, tools=tools)
  _check_format(fmt, obj, where)
  try:
    messages, specs = _PARSERS[fmt](obj)
  except ApiError as e:
    raise DataError(f"{where}: {e.message}") from None
  except ValueError as e:  # a Message the records refuse
    raise DataError(f"{where}: {e}") from None
  return Conversation(where, tuple(messages), tuple(specs))


def read_conversations(path: str, fmt: str, *, bad_lines: str, counts: Counts,
                       tools_file: str | None = None) -> Iterator[Conversation]:
  """The conversations of one JSONL file in format `fmt` ("openai" | "anthropic"), in file order."""
  if fmt not in FORMATS:
    raise FormatError(f"{path}: unknown trajectory format {fmt!r}; known: {FORMATS}")
  tools = load_tools(tools_file, fmt) if tools_file else None
  for lineno, line in _lines(path):
    try:
      yield _conversation(fmt, line, f"{path}:{lineno}", tools)
    except FormatError:
      raise
    except DataError as e:
      if bad_lines == "stop":
        raise
      counts["bad_lines"] += 1
      log.warning("skipped %s", e)


def read_rollouts(run_dir: str, *, min_score: float, rollout_files: Sequence[str], bad_lines: str,
                  counts: Counts) -> Iterator[tuple[str, list[CallRecord]]]:
  """(rollout id, its calls) of each rollout of a run directory that is ok and scored >= min_score, in
  rollout-id order. Counted: rollouts (records read), rollouts_below_min_score, rollouts_not_ok,
  rollouts_without_calls, and with bad_lines="skip" bad_records (records that could not be read; their
  rollouts are left out)."""
  root = pathlib.Path(run_dir)
  record_files = sorted({p for pattern in rollout_files for p in root.glob(pattern) if p.is_file()})
  if not record_files or not (root / "calls").is_dir():
    raise DataError(f"{run_dir}: not a train or eval run directory (it needs rollout records matching "
                    f"{list(rollout_files)} and a calls/ directory)")
  try:
    loaded = calllog.load([*map(str, record_files), str(root / "calls")],
                          errors="raise" if bad_lines == "stop" else "collect")
  except calllog.CallLogError as e:
    raise DataError(str(e)) from None
  for problem in loaded.problems:
    counts["bad_records"] += 1
    log.warning("skipped %s", problem)
  for rid in sorted(loaded.rollouts):
    record: RolloutRecord = loaded.rollouts[rid]
    counts["rollouts"] += 1
    if record.status != "ok" or record.reward is None:
      counts["rollouts_not_ok"] += 1
    elif record.reward < min_score:
      counts["rollouts_below_min_score"] += 1
    elif not loaded.calls.get(rid):
      counts["rollouts_without_calls"] += 1
    else:
      yield rid, loaded.calls[rid]
