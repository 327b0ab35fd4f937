"""The OpenAI Responses dialect (POST /v1/responses), as Codex CLI and the `openai` SDK's
`client.responses` use it.

Request: `input` as a string or a list of items; `instructions` (a system message first). Items:
  message (type "message", or a bare {role, content}): roles system / developer (both system messages),
      user, assistant; content a string or text parts (input_text, output_text; images, files, audio
      and refusals are skipped);
  function_call {call_id, name, arguments, namespace?}; function_call_output {call_id, output};
  reasoning {summary, content?, encrypted_content?}: the thinking of the assistant turn it opens;
  compaction {encrypted_content}: a summary this shim wrote (below), read back as a user message;
  compaction_trigger (last only): Codex's remote compaction (its `remote_compaction_v2` beta), below.
Other item types (hosted tools' calls, item_reference) are skipped. Consecutive reasoning, assistant
message and function_call items form one assistant turn: the turn a response's output was, read back
by the ids the shim gave its items (`rs_`/`msg_`/`fc_` + the response's hex) where the client echoes
them, else a reasoning item after text or calls, or text after calls, starts the next turn.

Tools: `function` tools as they are; a `namespace` tool (Codex's `multi_agent_v1`, MCP servers) is
flattened into its functions, each named `NAMESPACE.NAME` in the prompt; a call the model makes to
one goes out as {name, namespace} again. Hosted tools (`web_search`, file search, computer use, image
generation, ...) and `custom` (free-form) tools are left out of the prompt: the model cannot run them.
`reasoning.effort` "none" / "minimal" turns thinking off (like Chat Completions' `reasoning_effort`);
`max_output_tokens` caps the generation; `temperature` / `top_p` are recorded, not used; Codex's turn
metadata (`client_metadata["x-codex-turn-metadata"]`, a JSON string) and `metadata` become the
request's metadata, which roles are read from (profiles.py). `previous_response_id` is refused: the
shim stores no responses (`store` is accepted and ignored), so a client sends the whole conversation.

Response: output items `reasoning` (when the turn has thinking: its text as `content`, and with
`include: ["reasoning.encrypted_content"]` an `encrypted_content` this shim reads back exactly, so an
echoed turn's thinking is never lost or re-encoded), `message` (the text; also when a turn has neither
text nor calls), `function_call` per tool call (`call_id` the shim's `call_` id). Streamed as the API
streams: response.created, response.in_progress, per item output_item.added / content_part.added /
output_text.delta (reasoning_text.delta, function_call_arguments.delta) / ...done / output_item.done,
then response.completed with usage, whose `response` carries the whole output. Keep-alives are
response.in_progress events (Codex's stream reader times out on silence, and SSE comments are not
events). A generation cut at its token limit still ends in response.completed, its status "incomplete"
(incomplete_details.reason max_output_tokens): Codex reads response.incomplete as a dropped stream and
would retry the call. A failure after the stream began is a response.failed event (Codex retries it).
Errors before it are OpenAI's error bodies (an overloaded backend: 503 code "server_is_overloaded").

Remote compaction: a request ending with a compaction_trigger item asks the server to compact the
conversation. The shim asks the model for a handoff summary (COMPACTION_PROMPT appended as a user
message; the tools stay, so the prompt extends the conversation's and the engine's prefix cache serves
it) and answers one `compaction` item whose encrypted_content carries the turn's text (a tool call the
model makes there is dropped); a later request holding the item reads it back as a user message
(COMPACTION_SUMMARY_PREFIX + summary).

The opaque contents are `clawjax1.` + base64url of a JSON object: not secret (a client can send any
thinking as plain `content` too), only for this shim to read back. One a client did not get from a
shim like this one (a real OpenAI reasoning item) is read as its `content` or nothing.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import time
from typing import Any

from clawjax.serving import errors
from clawjax.serving import validate as v
from clawjax.serving.chat import (ChatRequest, ChatResult, Dialect, MessageMemo, TurnEvents,
                                  arguments_json, dumps, parse_arguments, sse)
from clawjax.serving.errors import ApiError, invalid
from clawjax.serving.openai_api import error_body
from clawjax.text.messages import Message, ToolCall, ToolSpec

COMPACTION_PROMPT = (
    "Write a handoff summary of this conversation for another model that will continue the task "
    "from it: what was asked and the constraints given, what has been done so far (files, commands "
    "and their results), the decisions taken, and what remains to do. Reply with the summary only.")
COMPACTION_SUMMARY_PREFIX = "Summary of the conversation so far (its earlier messages were compacted):\n\n"
ENCRYPTED_REASONING = "reasoning.encrypted_content"  # The `include` value that asks for it.
_OPAQUE_PREFIX = "clawjax1."
_TEXT_PARTS = ("input_text", "output_text", "reasoning_text", "text")  # (images, files, audio: skipped)
_ITEM_ID = re.compile(r"(?:rs|msg|fc|cmp)_([0-9a-f]{24})(?:_\d+)?")
# Codex's turn metadata kept in the request's metadata (and each call record's extra): what the roles
# and a reader of the log need; the rest (window ids, sandbox, timings) is left out.
CODEX_METADATA_KEYS = ("thread_id", "parent_thread_id", "agent_name", "request_kind", "thread_source",
                       "subagent_kind", "turn_id", "window_number", "compaction")
_CODEX_METADATA = "x-codex-turn-metadata"


def opaque(payload: dict[str, Any]) -> str:
  """An item's encrypted_content as this shim writes it."""
  return _OPAQUE_PREFIX + base64.urlsafe_b64encode(dumps(payload).encode()).decode()


def read_opaque(content: Any) -> dict[str, Any] | None:
  """The payload of an encrypted_content this shim wrote; None for any other."""
  if not isinstance(content, str) or not content.startswith(_OPAQUE_PREFIX):
    return None
  try:
    payload = json.loads(base64.urlsafe_b64decode(content[len(_OPAQUE_PREFIX):].encode()))
  except (ValueError, binascii.Error):
    return None
  return payload if isinstance(payload, dict) else None


@dataclasses.dataclass(frozen=True)
class _Piece:
  """One input item converted: a whole message, or part of an assistant turn (kind "thinking",
  "text" or "call"), with the turn it belongs to where its id says (`turn`)."""
  kind: str
  message: Message | None = None
  text: str | None = None
  call: ToolCall | None = None
  turn: str | None = None
  trigger: bool = False  # A compaction_trigger item.


def _text(content: Any, path: str) -> str:
  return v.text_of(content, path, _TEXT_PARTS)


def _turn_of(item: dict[str, Any]) -> str | None:
  """The response an item came from, by the id the shim gave it (None for any other id)."""
  ident = item.get("id")
  match = _ITEM_ID.fullmatch(ident) if isinstance(ident, str) else None
  return match.group(1) if match else None


def _reasoning(item: dict[str, Any], where: str) -> _Piece:
  """The thinking this shim wrote (from encrypted_content), else the item's reasoning text, if any."""
  payload = read_opaque(item.get("encrypted_content"))
  if payload is not None and isinstance(payload.get("thinking"), str):
    return _Piece("thinking", text=payload["thinking"], turn=payload.get("turn") or _turn_of(item))
  text = _text(v.get(item, "content", where, list, default=[]), f"{where}.content")
  return _Piece("thinking", text=text or None, turn=_turn_of(item))


def _item(item: Any, i: int) -> list[_Piece]:
  where = f"input.{i}"
  item = v.check(item, where, dict)
  kind = v.get(item, "type", where, str, default="message")
  if kind == "message":
    role = v.get(item, "role", where, str)
    text = _text(v.get(item, "content", where, str, list), f"{where}.content")
    if role in ("system", "developer"):
      return [_Piece("message", Message("system", text))]
    if role == "user":
      return [_Piece("message", Message("user", text))]
    if role == "assistant":
      return [_Piece("text", text=text, turn=_turn_of(item))]
    raise invalid(f"{where}.role", f"expected 'user', 'assistant', 'system' or 'developer', got {role!r}")
  if kind == "function_call":
    name = v.get(item, "name", where, str)
    namespace = v.get(item, "namespace", where, str, default=None)
    call = ToolCall(v.get(item, "call_id", where, str), f"{namespace}.{name}" if namespace else name,
                    parse_arguments(v.get(item, "arguments", where, str)))
    return [_Piece("call", call=call, turn=_turn_of(item))]
  if kind == "function_call_output":
    output = _text(v.get(item, "output", where, str, list), f"{where}.output")
    return [_Piece("message", Message("tool", output, tool_call_id=v.get(item, "call_id", where, str)))]
  if kind == "reasoning":
    return [_reasoning(item, where)]
  if kind == "compaction":
    payload = read_opaque(v.get(item, "encrypted_content", where, str))
    if payload is None or not isinstance(payload.get("summary"), str):
      raise invalid(f"{where}.encrypted_content", "not a compaction this shim wrote")
    return [_Piece("message", Message("user", COMPACTION_SUMMARY_PREFIX + payload["summary"]))]
  if kind == "compaction_trigger":
    return [_Piece("trigger", trigger=True)]
  if kind == "item_reference":
    raise invalid(f"{where}.type", "item_reference needs a stored response; the shim stores none: send "
                  "the items themselves")
  return []  # A hosted tool's call or output: nothing the model wrote or can read.


class _Turn:
  """An assistant turn being gathered from its items."""

  def __init__(self, turn: str | None):
    self.turn, self.thinking, self.texts, self.calls = turn, [], [], []

  def takes(self, piece: _Piece) -> bool:
    """Whether `piece` continues this turn (else it starts the next one)."""
    if piece.turn and self.turn and piece.turn != self.turn:
      return False
    if piece.kind == "thinking":
      return not (self.texts or self.calls or self.thinking)
    return not (piece.kind == "text" and self.calls)

  def add(self, piece: _Piece) -> None:
    self.turn = self.turn or piece.turn
    if piece.kind == "call":
      self.calls.append(piece.call)
    elif piece.text is not None:
      (self.thinking if piece.kind == "thinking" else self.texts).append(piece.text)

  def message(self) -> Message:
    return Message("assistant", "\n".join(self.texts),
                   thinking="\n".join(self.thinking) if self.thinking else None, tool_calls=self.calls)


def _messages(pieces: list[_Piece]) -> list[Message]:
  out: list[Message] = []
  turn: _Turn | None = None
  for piece in pieces:
    if piece.kind == "message":
      if turn is not None:
        out.append(turn.message())
        turn = None
      out.append(piece.message)
      continue
    if turn is not None and not turn.takes(piece):
      out.append(turn.message())
      turn = None
    turn = turn or _Turn(piece.turn)
    turn.add(piece)
  if turn is not None:
    out.append(turn.message())
  return out


def _function(tool: dict[str, Any], where: str, prefix: str = "") -> ToolSpec:
  return ToolSpec(name=prefix + v.get(tool, "name", where, str),
                  description=v.get(tool, "description", where, str, default=""),
                  parameters=v.get(tool, "parameters", where, dict, default={}))


def _tools(tools: Any) -> list[ToolSpec]:
  out = []
  for i, tool in enumerate(v.check(tools, "tools", list)):
    where = f"tools.{i}"
    kind = v.get(v.check(tool, where, dict), "type", where, str)
    if kind == "function":
      out.append(_function(tool, where))
    elif kind == "namespace":
      prefix = v.get(tool, "name", where, str) + "."
      for j, inner in enumerate(v.get(tool, "tools", where, list)):
        inner_where = f"{where}.tools.{j}"
        if v.get(v.check(inner, inner_where, dict), "type", inner_where, str) == "function":
          out.append(_function(inner, inner_where, prefix))
  return out


def _namespaced(tools: list[Any]) -> dict[str, tuple[str, str]]:
  """Qualified name -> (namespace, name) of the request's namespace tools' functions."""
  return {f"{t['name']}.{f['name']}": (t["name"], f["name"])
          for t in tools if t.get("type") == "namespace" for f in t.get("tools", ())
          if isinstance(f, dict) and f.get("type") == "function"}


def _metadata(body: dict[str, Any]) -> dict[str, Any]:
  """The request's `metadata` and the kept keys of Codex's turn metadata (bad JSON there: none)."""
  out = dict(v.get(body, "metadata", "", dict, default={}))
  raw = v.get(body, "client_metadata", "", dict, default={}).get(_CODEX_METADATA)
  try:
    codex = json.loads(raw) if isinstance(raw, str) else {}
  except ValueError:
    codex = {}
  if isinstance(codex, dict):
    out.update((k, codex[k]) for k in CODEX_METADATA_KEYS if k in codex)
  return out


@dataclasses.dataclass(frozen=True)
class _Reply:
  """What a response needs of its request."""
  namespaced: dict[str, tuple[str, str]]
  compaction: bool  # The request ended with a compaction_trigger.
  encrypted_reasoning: bool  # `include` asks for reasoning items' encrypted_content.
  echo: dict[str, Any]  # Request fields a Response object repeats.


def parse_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
  body = v.check(body, "body", dict)
  memo = memo or MessageMemo()
  if v.get(body, "previous_response_id", "", str, default=None) is not None:
    raise invalid("previous_response_id", "not supported: the shim stores no responses; send the whole "
                  "conversation in `input` (store: false)")
  raw = v.get(body, "input", "", str, list)
  items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
  if not items:
    raise invalid("input", "at least one item is required")
  pieces = memo.convert(items, _item)
  compaction = bool(pieces) and pieces[-1].trigger
  if any(p.trigger for p in pieces[:-1]):
    raise invalid("input", "a compaction_trigger item must be the last one")
  messages = _messages([p for p in pieces if not p.trigger])
  instructions = v.get(body, "instructions", "", str, default=None)
  if instructions:
    messages.insert(0, Message("system", instructions))
  raw_tools = v.get(body, "tools", "", list, default=[])
  tools = memo.convert_tools(raw_tools, _tools)
  if compaction:
    messages.append(Message("user", COMPACTION_PROMPT))
  elif not messages or messages[-1].role == "assistant":
    raise invalid("input", "the last item must be a message, a function_call_output or a "
                  "compaction_trigger, not the assistant's turn")
  reasoning = v.get(body, "reasoning", "", dict, default={})
  effort = v.get(reasoning, "effort", "reasoning", str, default=None)
  include = v.get(body, "include", "", list, default=[])
  sampling = {k: body[k] for k in ("temperature", "top_p") if k in body}
  for k in sampling:
    v.get(body, k, "", float, default=None)
  echo = {"parallel_tool_calls": v.get(body, "parallel_tool_calls", "", bool, default=True),
          "tool_choice": body.get("tool_choice", "auto"), "temperature": sampling.get("temperature"),
          "top_p": sampling.get("top_p"), "max_output_tokens": v.positive_int(body, "max_output_tokens"),
          "instructions": instructions}
  v.get(body, "store", "", bool, default=None)
  return ChatRequest(
      model=v.get(body, "model", "", str), messages=messages, tools=tools,
      max_tokens=echo["max_output_tokens"], stream=v.get(body, "stream", "", bool, default=False),
      enable_thinking=None if effort is None else effort not in ("none", "minimal"),
      client_sampling=sampling, metadata=_metadata(body),
      reply=_Reply(_namespaced(raw_tools), compaction, ENCRYPTED_REASONING in include, echo))


def _usage(result: ChatResult) -> dict[str, Any]:
  return {"input_tokens": result.input_tokens, "input_tokens_details": {"cached_tokens": 0},
          "output_tokens": result.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
          "total_tokens": result.input_tokens + result.output_tokens}


class _Output:
  """The output items of one response, by the ids its stream and its body share."""

  def __init__(self, response_id: str, reply: _Reply):
    self.hex, self.reply = response_id.removeprefix(ResponsesDialect.message_id_prefix), reply

  def reasoning(self, thinking: str | None) -> dict[str, Any]:
    item = {"type": "reasoning", "id": f"rs_{self.hex}", "summary": [],
            "content": [{"type": "reasoning_text", "text": thinking}] if thinking is not None else [],
            "status": "completed" if thinking is not None else "in_progress"}
    if self.reply.encrypted_reasoning and thinking is not None:
      item["encrypted_content"] = opaque({"thinking": thinking, "turn": self.hex})
    return item

  def message(self, text: str | None) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{self.hex}", "role": "assistant",
            "status": "completed" if text is not None else "in_progress",
            "content": [_output_text(text)] if text is not None else []}

  def call(self, k: int, call: ToolCall) -> dict[str, Any]:
    namespace, name = self.reply.namespaced.get(call.name, (None, call.name))
    item = {"type": "function_call", "id": f"fc_{self.hex}_{k}", "call_id": call.id, "name": name,
            "arguments": arguments_json(call), "status": "completed"}
    if namespace:
      item["namespace"] = namespace
    return item

  def compaction(self, summary: str) -> dict[str, Any]:
    return {"type": "compaction", "id": f"cmp_{self.hex}", "encrypted_content": opaque({"summary": summary})}

  def items(self, result: ChatResult) -> list[dict[str, Any]]:
    turn = result.turn
    if self.reply.compaction:
      return [self.compaction(turn.text)]
    out = [self.reasoning(turn.thinking)] if turn.thinking else []
    if turn.text or not turn.tool_calls:
      out.append(self.message(turn.text))
    return out + [self.call(k, c) for k, c in enumerate(turn.tool_calls)]


def _output_text(text: str) -> dict[str, Any]:
  return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _response(response_id: str, model: str, reply: _Reply, status: str, output: list[dict[str, Any]],
              result: ChatResult | None = None, error: ApiError | None = None) -> dict[str, Any]:
  """A Response object; `result` completes it (status from its finish reason, and usage)."""
  incomplete = None
  if result is not None and result.finish_reason == "length":
    status, incomplete = "incomplete", {"reason": "max_output_tokens"}
  return {"id": response_id, "object": "response", "created_at": int(time.time()), "model": model,
          "status": status, "output": output, "tools": [], "metadata": {}, "incomplete_details": incomplete,
          "error": None if error is None else {"code": "server_error", "message": error.message},
          "usage": None if result is None else _usage(result), **reply.echo}


class _ResponsesEvents(TurnEvents):
  """Items in order: reasoning, message, then one per tool call; a compaction request's one item."""

  def __init__(self, message_id: str, model: str, request: ChatRequest):
    super().__init__(message_id, model, request)
    self.reply: _Reply = request.reply
    self.items = _Output(message_id, self.reply)
    self.sequence, self.index, self.open_kind = 0, -1, None
    self.streamed = {"thinking": "", "text": ""}
    self.output: list[dict[str, Any]] = []  # The items done so far.
    self.result: ChatResult | None = None

  def _event(self, kind: str, **fields: Any) -> bytes:
    self.sequence += 1
    return sse({"type": kind, "sequence_number": self.sequence - 1, **fields}, kind)

  def _lifecycle(self, kind: str, status: str, **more: Any) -> bytes:
    return self._event(kind, response=_response(self.message_id, self.model, self.reply, status,
                                                self.output, **more))

  def head(self, input_tokens: int) -> bytes:
    return (self._lifecycle("response.created", "in_progress")
            + self._lifecycle("response.in_progress", "in_progress"))

  def keepalive(self) -> bytes:
    return self._lifecycle("response.in_progress", "in_progress")

  def _added(self, item: dict[str, Any]) -> bytes:
    self.index += 1
    return self._event("response.output_item.added", output_index=self.index, item=item)

  def _done(self, item: dict[str, Any]) -> bytes:
    self.output.append(item)
    return self._event("response.output_item.done", output_index=self.index, item=item)

  def _at(self, item_id: str) -> dict[str, Any]:
    return {"item_id": item_id, "output_index": self.index, "content_index": 0}

  def _open(self, kind: str) -> bytes:
    self.open_kind = kind
    if kind == "thinking":
      item, part = self.items.reasoning(None), {"type": "reasoning_text", "text": ""}
    else:
      item, part = self.items.message(None), _output_text("")
    return self._added(item) + self._event("response.content_part.added", part=part, **self._at(item["id"]))

  def _close(self) -> bytes:
    """Ends the open reasoning or message item with what was streamed of it."""
    kind, self.open_kind = self.open_kind, None
    text = self.streamed[kind]
    if kind == "thinking":
      item = self.items.reasoning(text)
      done = self._event("response.reasoning_text.done", text=text, **self._at(item["id"]))
    else:
      item = self.items.message(text)
      done = self._event("response.output_text.done", text=text, logprobs=[], **self._at(item["id"]))
    part = item["content"][0]
    return done + self._event("response.content_part.done", part=part, **self._at(item["id"])) + self._done(item)

  def _piece(self, kind: str, text: str) -> bytes:
    if self.reply.compaction or not text:
      return b""  # A compaction's summary goes out whole, as its one item.
    out = b""
    if self.open_kind != kind:
      if self.open_kind is not None:  # (Thinking comes before text, and only once.)
        out += self._close()
      out += self._open(kind)
    self.streamed[kind] += text
    if kind == "thinking":
      return out + self._event("response.reasoning_text.delta", delta=text, **self._at(f"rs_{self.items.hex}"))
    return out + self._event("response.output_text.delta", delta=text, logprobs=[],
                             **self._at(f"msg_{self.items.hex}"))

  def _end(self, result: ChatResult) -> bytes:
    """Closes the streamed item; then the items not streamed (the streamed ones are a prefix of the
    turn's items: its thinking and text are all streamed by now)."""
    out = [self._close()] if self.open_kind is not None else []
    for item in self.items.items(result)[len(self.output):]:
      if item["type"] == "function_call":
        at = {"item_id": item["id"], "output_index": self.index + 1}
        out += [self._added(dict(item, arguments="", status="in_progress")),
                self._event("response.function_call_arguments.delta", delta=item["arguments"], **at),
                self._event("response.function_call_arguments.done", name=item["name"],
                            arguments=item["arguments"], **at),
                self._done(item)]
      else:  # A message without text, or a compaction's summary.
        out += [self._added(item), self._done(item)]
    self.result = result
    return b"".join(out)

  def final(self) -> bytes:
    return self._lifecycle("response.completed", "completed", result=self.result)

  def error(self, err: ApiError) -> bytes:
    return self._lifecycle("response.failed", "failed", error=err)


class ResponsesDialect(Dialect):
  name = "responses"
  tool_id_prefix = "call_"
  message_id_prefix = "resp_"
  overloaded_status = 503

  def parse_request(self, body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    return parse_request(body, memo)

  def response(self, result: ChatResult, request: ChatRequest, model: str, message_id: str
               ) -> dict[str, Any]:
    return _response(message_id, model, request.reply, "completed",
                     _Output(message_id, request.reply).items(result), result=result)

  def turn_events(self, message_id: str, model: str, request: ChatRequest) -> TurnEvents:
    return _ResponsesEvents(message_id, model, request)

  def error_body(self, err: ApiError) -> dict[str, Any]:
    return error_body(err, {errors.OVERLOADED: "server_is_overloaded"})
