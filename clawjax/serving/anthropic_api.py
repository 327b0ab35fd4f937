"""The Anthropic Messages dialect (POST /v1/messages, /v1/messages/count_tokens).

Accepted: `system` as a string or text blocks; `role: "system"` messages inside `messages`; content as a
string or blocks (text, tool_use, tool_result with string or block content and `is_error`, thinking);
unknown fields, unknown block types (images, documents, server tools) and betas are ignored. Tools with
`defer_loading: true` are left out of the prompt, as the real API does until they are loaded.
"""

from __future__ import annotations

from typing import Any

from clawjax.serving import validate as v
from clawjax.serving.chat import (ChatRequest, ChatResult, Dialect, MessageMemo, TurnEvents, dumps,
                                  sse)
from clawjax.serving.errors import ApiError, invalid
from clawjax.text.messages import Message, ToolCall, ToolSpec

_ERROR_TYPES = {"invalid_request": "invalid_request_error", "authentication": "authentication_error",
                "permission": "permission_error", "not_found": "not_found_error",
                "method_not_allowed": "invalid_request_error", "request_timeout": "invalid_request_error",
                "request_too_large": "request_too_large", "context_length_exceeded": "invalid_request_error",
                "overloaded": "overloaded_error", "unavailable": "overloaded_error", "internal": "api_error"}
# Tool results flagged is_error are marked in the prompt text, since the chat templates have no flag.
TOOL_ERROR_PREFIX = "Error: "


def _user_messages(content: Any, path: str) -> list[Message]:
  """A user turn: tool_result blocks become tool messages, text blocks one user message each run."""
  if isinstance(content, str):
    return [Message(role="user", content=content)]
  out: list[Message] = []
  texts: list[str] = []

  def flush():
    if texts:
      out.append(Message(role="user", content="\n".join(texts)))
      texts.clear()

  for where, block, kind in v.blocks(content, path):
    if kind == "text":
      texts.append(v.get(block, "text", where, str))
    elif kind == "tool_result":
      flush()
      text = v.text_of(block.get("content", ""), f"{where}.content")
      if v.get(block, "is_error", where, bool, default=False):
        text = TOOL_ERROR_PREFIX + text
      out.append(Message(role="tool", content=text,
                         tool_call_id=v.get(block, "tool_use_id", where, str)))
  flush()
  return out


def _assistant_message(content: Any, path: str) -> Message:
  if isinstance(content, str):
    return Message(role="assistant", content=content)
  texts, thinking, calls = [], [], []
  for where, block, kind in v.blocks(content, path):
    if kind == "text":
      texts.append(v.get(block, "text", where, str))
    elif kind == "thinking":
      thinking.append(v.get(block, "thinking", where, str))
    elif kind == "tool_use":
      calls.append(ToolCall(id=v.get(block, "id", where, str), name=v.get(block, "name", where, str),
                            arguments=v.get(block, "input", where, dict)))
  return Message(role="assistant", content="\n".join(texts),
                 thinking="\n".join(thinking) if thinking else None, tool_calls=calls)


def _tools(tools: Any) -> list[ToolSpec]:
  out = []
  for i, tool in enumerate(v.check(tools, "tools", list)):
    where = f"tools.{i}"
    tool = v.check(tool, where, dict)
    if "input_schema" not in tool or v.get(tool, "defer_loading", where, bool, default=False):
      continue  # A server tool (web search, ...) or a deferred one: not callable by this model.
    out.append(ToolSpec(name=v.get(tool, "name", where, str),
                        description=v.get(tool, "description", where, str, default=""),
                        parameters=v.get(tool, "input_schema", where, dict)))
  return out


def _message(m: Any, i: int) -> list[Message]:
  where = f"messages.{i}"
  m = v.check(m, where, dict)
  role = v.get(m, "role", where, str)
  content = v.get(m, "content", where, str, list)
  if role == "user":
    return _user_messages(content, f"{where}.content")
  if role == "assistant":
    return [_assistant_message(content, f"{where}.content")]
  if role == "system":
    return [Message(role="system", content=v.text_of(content, f"{where}.content"))]
  raise invalid(f"{where}.role", f"expected 'user', 'assistant' or 'system', got {role!r}")


def parse_conversation(body: Any, memo: MessageMemo | None = None) -> tuple[list[Message], list[ToolSpec]]:
  """A body's `system`, `messages` and `tools` as a request's are converted, without what only a request
  must meet: a recorded conversation (an SFT trajectory) may end with the assistant's turn. ApiError
  names the field."""
  body = v.check(body, "body", dict)
  memo = memo or MessageMemo()
  messages: list[Message] = []
  system = body.get("system")
  if system is not None:
    text = v.text_of(system, "system")
    if text:
      messages.append(Message(role="system", content=text))
  raw = v.get(body, "messages", "", list)
  if not raw:
    raise invalid("messages", "at least one message is required")
  messages += memo.convert(raw, _message)
  return messages, memo.convert_tools(v.get(body, "tools", "", list, default=[]), _tools)


def parse_messages(body: Any, *, need_max_tokens: bool, memo: MessageMemo | None = None
                   ) -> ChatRequest:
  body = v.check(body, "body", dict)
  memo = memo or MessageMemo()
  messages, tools = parse_conversation(body, memo)
  raw = body["messages"]
  if raw[-1].get("role") == "assistant":
    raise invalid(f"messages.{len(raw) - 1}.role", "a final assistant turn (prefill) is not supported")
  max_tokens = v.positive_int(body, "max_tokens") if need_max_tokens else None
  if need_max_tokens and max_tokens is None:
    raise invalid("max_tokens", "field required")
  thinking = v.get(body, "thinking", "", dict, default=None)
  enable_thinking = None
  if thinking is not None:
    enable_thinking = v.get(thinking, "type", "thinking", str) != "disabled"
  sampling = {k: body[k] for k in ("temperature", "top_p", "top_k") if k in body}
  for k in sampling:
    v.get(body, k, "", float, default=None)
  return ChatRequest(
      model=v.get(body, "model", "", str), messages=messages, tools=tools, max_tokens=max_tokens,
      stream=v.get(body, "stream", "", bool, default=False), enable_thinking=enable_thinking,
      client_sampling=sampling)


def _text_block(kind: str, text: str) -> dict[str, Any]:
  """A "thinking" or "text" content block (a streamed one starts empty and grows by deltas)."""
  return {"type": "thinking", "thinking": text, "signature": ""} if kind == "thinking" else {
      "type": "text", "text": text}


def _blocks(result: ChatResult) -> list[dict[str, Any]]:
  turn = result.turn
  blocks = [_text_block(kind, text) for kind, text in (("thinking", turn.thinking), ("text", turn.text))
            if text]
  for call in turn.tool_calls:
    args = call.arguments if isinstance(call.arguments, dict) else {}
    blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": args})
  return blocks


def _stop_reason(result: ChatResult) -> str:
  if result.finish_reason == "length":
    return "max_tokens"
  return "tool_use" if result.turn.tool_calls else "end_turn"


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
  return {"input_tokens": input_tokens, "output_tokens": output_tokens,
          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


class _AnthropicEvents(TurnEvents):
  """Content blocks in order: thinking, text, then one per tool call (as the API sends them)."""

  def __init__(self, message_id: str, model: str, request: ChatRequest):
    super().__init__(message_id, model, request)
    self.index, self.open_kind = -1, None

  def head(self, input_tokens: int) -> bytes:
    message = {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": _usage(input_tokens, 1)}
    return sse({"type": "message_start", "message": message}, "message_start")

  def keepalive(self) -> bytes:
    return sse({"type": "ping"}, "ping")

  def _start(self, block: dict[str, Any]) -> bytes:
    self.index += 1
    return sse({"type": "content_block_start", "index": self.index, "content_block": block},
               "content_block_start")

  def _block_delta(self, delta: dict[str, Any]) -> bytes:
    return sse({"type": "content_block_delta", "index": self.index, "delta": delta},
               "content_block_delta")

  def _stop(self) -> bytes:
    self.open_kind = None
    return sse({"type": "content_block_stop", "index": self.index}, "content_block_stop")

  def _piece(self, kind: str, text: str) -> bytes:
    out = b""
    if self.open_kind != kind:
      if self.open_kind is not None:
        out += self._stop()
      self.open_kind = kind
      out += self._start(_text_block(kind, ""))
    return out + self._block_delta({"type": kind + "_delta", kind: text})

  def _end(self, result: ChatResult) -> bytes:
    out = [self._stop()] if self.open_kind is not None else []
    for block in _blocks(result):
      if block["type"] == "tool_use":
        out += [self._start(dict(block, input={})),
                self._block_delta({"type": "input_json_delta", "partial_json": dumps(block["input"])}),
                self._stop()]
    out.append(sse({"type": "message_delta",
                    "delta": {"stop_reason": _stop_reason(result), "stop_sequence": None},
                    "usage": {"output_tokens": result.output_tokens}}, "message_delta"))
    return b"".join(out)

  def final(self) -> bytes:
    return sse({"type": "message_stop"}, "message_stop")

  def error(self, err: ApiError) -> bytes:
    return sse(_error_body(err), "error")


def _error_body(err: ApiError) -> dict[str, Any]:
  return {"type": "error", "error": {"type": _ERROR_TYPES[err.kind], "message": err.message}}


class AnthropicDialect(Dialect):
  name = "anthropic"
  tool_id_prefix = "toolu_"
  message_id_prefix = "msg_"
  overloaded_status = 529

  def parse_request(self, body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    return parse_messages(body, need_max_tokens=True, memo=memo)

  def response(self, result: ChatResult, request: ChatRequest, model: str, message_id: str
               ) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": _blocks(result), "stop_reason": _stop_reason(result), "stop_sequence": None,
            "usage": _usage(result.input_tokens, result.output_tokens)}

  def turn_events(self, message_id: str, model: str, request: ChatRequest) -> TurnEvents:
    return _AnthropicEvents(message_id, model, request)

  def error_body(self, err: ApiError) -> dict[str, Any]:
    return _error_body(err)
