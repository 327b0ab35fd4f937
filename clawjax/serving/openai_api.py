"""The OpenAI Chat Completions dialect (POST /v1/chat/completions).

Accepted: roles system/developer/user/assistant/tool; content as a string, null or text parts;
assistant `tool_calls` (arguments kept verbatim when not a JSON object) and `reasoning_content`;
`tools` of type function; `max_tokens` or `max_completion_tokens`; `stream_options.include_usage`.
Unknown fields are ignored; `n` other than 1 is refused (one sample per call keeps the log linear).
"""

from __future__ import annotations

import time
from typing import Any

from clawjax.serving import validate as v
from clawjax.serving.chat import (ChatRequest, ChatResult, Dialect, MessageMemo, TurnEvents,
                                  arguments_json, parse_arguments, sse)
from clawjax.serving.errors import ApiError, invalid
from clawjax.text.messages import Message, ToolCall, ToolSpec

_ERROR_TYPES = {"invalid_request": "invalid_request_error", "authentication": "invalid_request_error",
                "permission": "invalid_request_error", "not_found": "invalid_request_error",
                "method_not_allowed": "invalid_request_error", "request_timeout": "invalid_request_error",
                "request_too_large": "invalid_request_error", "context_length_exceeded": "invalid_request_error",
                "overloaded": "server_error", "unavailable": "server_error", "internal": "server_error"}
_ERROR_CODES = {"authentication": "invalid_api_key", "permission": "permission_denied",
                "context_length_exceeded": "context_length_exceeded", "not_found": "not_found"}


def _message(m: Any, where: str) -> Message:
  m = v.check(m, where, dict)
  role = v.get(m, "role", where, str)
  content = m.get("content")
  content = v.text_of("" if content is None else content, f"{where}.content")
  if role in ("system", "developer"):
    return Message(role="system", content=content)
  if role == "user":
    return Message(role="user", content=content)
  if role == "tool":
    return Message(role="tool", content=content, tool_call_id=v.get(m, "tool_call_id", where, str),
                   name=v.get(m, "name", where, str, default=None))
  if role == "assistant":
    calls = []
    for j, c in enumerate(v.get(m, "tool_calls", where, list, default=[])):
      cw = f"{where}.tool_calls.{j}"
      c = v.check(c, cw, dict)
      fn = v.get(c, "function", cw, dict)
      calls.append(ToolCall(id=v.get(c, "id", cw, str), name=v.get(fn, "name", f"{cw}.function", str),
                            arguments=parse_arguments(v.get(fn, "arguments", f"{cw}.function", str))))
    return Message(role="assistant", content=content,
                   thinking=v.get(m, "reasoning_content", where, str, default=None), tool_calls=calls)
  raise invalid(f"{where}.role", f"unknown role {role!r}")


def _tools(tools: Any) -> list[ToolSpec]:
  out = []
  for i, t in enumerate(v.check(tools, "tools", list)):
    where = f"tools.{i}"
    t = v.check(t, where, dict)
    if v.get(t, "type", where, str, default="function") != "function":
      continue
    fn = v.get(t, "function", where, dict)
    out.append(ToolSpec(name=v.get(fn, "name", f"{where}.function", str),
                        description=v.get(fn, "description", f"{where}.function", str, default=""),
                        parameters=v.get(fn, "parameters", f"{where}.function", dict, default={})))
  return out


def parse_conversation(body: Any, memo: MessageMemo | None = None) -> tuple[list[Message], list[ToolSpec]]:
  """A body's `messages` and `tools` as a request's are converted, without what only a request must meet:
  a recorded conversation (an SFT trajectory) may end with the assistant's turn. ApiError names the field."""
  body = v.check(body, "body", dict)
  raw = v.get(body, "messages", "", list)
  if not raw:
    raise invalid("messages", "at least one message is required")
  memo = memo or MessageMemo()
  messages = memo.convert(raw, lambda m, i: [_message(m, f"messages.{i}")])
  return messages, memo.convert_tools(v.get(body, "tools", "", list, default=[]), _tools)


def _finish_reason(result: ChatResult) -> str:
  if result.finish_reason == "length":
    return "length"
  return "tool_calls" if result.turn.tool_calls else "stop"


def _tool_calls(result: ChatResult) -> list[dict[str, Any]]:
  return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": arguments_json(c)}}
          for c in result.turn.tool_calls]


def _usage(result: ChatResult) -> dict[str, int]:
  return {"prompt_tokens": result.input_tokens, "completion_tokens": result.output_tokens,
          "total_tokens": result.input_tokens + result.output_tokens}


class _OpenAIEvents(TurnEvents):
  """Chunks: the role, reasoning and content deltas, tool calls, the finish reason, then usage."""

  def __init__(self, message_id: str, model: str, request: ChatRequest):
    super().__init__(message_id, model, request)
    self.started = False

  def head(self, input_tokens: int) -> bytes:
    return b""  # Nothing is known that a client needs early; keep-alives hold the connection.

  def keepalive(self) -> bytes:
    return KEEPALIVE

  def _chunk(self, delta: dict[str, Any] | None, finish_reason: str | None = None,
             usage: dict[str, int] | None = None) -> bytes:
    head = b""
    if not self.started and delta is not None:  # The first chunk names the role.
      self.started = True
      head = self._chunk({"role": "assistant", "content": ""})
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                         "finish_reason": finish_reason}]
    chunk = {"id": self.message_id, "object": "chat.completion.chunk", "created": int(time.time()),
             "model": self.model, "choices": choices}
    if usage is not None:
      chunk["usage"] = usage
    return head + sse(chunk)

  def _piece(self, kind: str, text: str) -> bytes:
    return self._chunk({"reasoning_content": text} if kind == "thinking" else {"content": text})

  def _end(self, result: ChatResult) -> bytes:
    out = [self._chunk({"tool_calls": [dict(call, index=i)]})
           for i, call in enumerate(_tool_calls(result))]
    out.append(self._chunk({}, _finish_reason(result)))
    if self.request.include_usage:
      out.append(self._chunk(None, usage=_usage(result)))
    return b"".join(out)

  def final(self) -> bytes:
    return sse("[DONE]")

  def error(self, err: ApiError) -> bytes:
    return sse(error_body(err))


KEEPALIVE = b": keep-alive\n\n"  # An SSE comment: every client ignores it.


def error_body(err: ApiError, codes: dict[str, str] | None = None) -> dict[str, Any]:
  """OpenAI's error shape; `codes` adds or replaces error codes by kind."""
  code = (codes or {}).get(err.kind) or _ERROR_CODES.get(err.kind)
  return {"error": {"message": err.message, "type": _ERROR_TYPES[err.kind], "param": err.param,
                    "code": code}}


class OpenAIDialect(Dialect):
  name = "openai"
  tool_id_prefix = "call_"
  message_id_prefix = "chatcmpl-"
  overloaded_status = 503

  def parse_request(self, body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    body = v.check(body, "body", dict)
    memo = memo or MessageMemo()
    messages, tools = parse_conversation(body, memo)
    if messages[-1].role == "assistant":
      raise invalid(f"messages.{len(body['messages']) - 1}.role", "a final assistant turn is not supported")
    n = v.get(body, "n", "", int, default=1)
    if n != 1:
      raise invalid("n", f"only n=1 is supported, got {n}")
    max_tokens = v.positive_int(body, "max_completion_tokens") or v.positive_int(body, "max_tokens")
    options = v.get(body, "stream_options", "", dict, default={})
    effort = v.get(body, "reasoning_effort", "", str, default=None)
    sampling = {k: body[k] for k in ("temperature", "top_p") if k in body}
    for k in sampling:
      v.get(body, k, "", float, default=None)
    return ChatRequest(
        model=v.get(body, "model", "", str), messages=messages,
        tools=tools, max_tokens=max_tokens, stream=v.get(body, "stream", "", bool, default=False),
        enable_thinking=None if effort is None else effort not in ("none", "minimal"),
        include_usage=v.get(options, "include_usage", "stream_options", bool, default=False),
        client_sampling=sampling)

  def response(self, result: ChatResult, request: ChatRequest, model: str, message_id: str
               ) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.turn.text or None}
    if result.turn.thinking:
      message["reasoning_content"] = result.turn.thinking
    if result.turn.tool_calls:
      message["tool_calls"] = _tool_calls(result)
    return {"id": message_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": _finish_reason(result)}],
            "usage": _usage(result)}

  def turn_events(self, message_id: str, model: str, request: ChatRequest) -> TurnEvents:
    return _OpenAIEvents(message_id, model, request)

  def error_body(self, err: ApiError) -> dict[str, Any]:
    return error_body(err)
