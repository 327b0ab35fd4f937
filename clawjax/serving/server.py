"""The shim's HTTP server: admin API, both API dialects, call-log writing.

Routes (every model route also exists under the per-rollout prefix `/r/{rollout_id}`, which is what
`POST /rollouts` hands out as `base_url`; without the prefix the rollout is found by its key alone):
  POST /v1/messages[?beta=true]     Anthropic Messages      POST /v1/messages/count_tokens
  POST /v1/chat/completions         OpenAI Chat Completions GET  /v1/models
  POST /rollouts {task_id, harness[, rollout_id]}
      -> {rollout_id, base_url, openai_base_url, api_key, log_path, context_window}
  POST /rollouts/{id}/finish        GET /rollouts/{id}      GET /health

A call: authenticate (401, nothing written) -> read the body under a size limit (413) -> validate (400)
-> build the prompt token-in-token-out (400 "prompt is too long" past --max-context) -> generate on the
backend, sending keep-alives (or, with `incremental_stream`, the text so far) while it runs -> parse the
turn -> append the call record (fsynced) -> send the rest of the turn. A backend failure is answered in
the API's error shape and logged as an `error` record.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from clawjax.calllog import CallRecord
from clawjax.serving import errors
from clawjax.serving.anthropic_api import AnthropicDialect, parse_messages
from clawjax.generation import Generation, SamplingParams
from clawjax.serving.backends.base import Backend, BackendError, PromptIds
from clawjax.serving.chat import ChatRequest, ChatResult, Dialect, TurnEvents, dumps, new_id
from clawjax.serving.errors import ApiError
from clawjax.serving.logwriter import EncodedInput
from clawjax.serving.openai_api import OpenAIDialect
from clawjax.serving.profiles import HarnessProfile, profile_for
from clawjax.serving.rollouts import Rollout, RolloutRegistry
from clawjax.text.messages import ParsedTurn
from clawjax.text.prompt import PromptBuilder
from clawjax.text.templates import ChatTemplate
from clawjax.text.turn_stream import TurnStream

log = logging.getLogger(__name__)


@dataclasses.dataclass
class ShimConfig:
  """Server settings. Sampling settings apply to every call whatever the client asks, so the rollout
  distribution (and the log-probs' temperature) is the one the trainer expects."""
  log_dir: str
  model_name: str = "policy"  # Reported in responses and logged as CallRecord.model.
  host: str = "127.0.0.1"
  port: int = 0  # 0: any free port.
  max_new_tokens: int = 8192  # The paper's recipe; Claude Code asks for 32K-128K.
  # Prompt + generation budget; longer prompts get "prompt is too long". An engine that tells a smaller
  # limit of its own (vLLM's --max-model-len, the embedded engine's max_seq_len) sets it instead. The
  # paper's 64K: Claude Code, told this window, compacts from the window less 33K tokens on (its output
  # and summary reserves), so at 32K it would compact after every tool call.
  max_context: int = 65536
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1
  max_body_bytes: int = 32 * 1024 * 1024  # Claude Code sends ~75 KB; images can reach a few MB.
  # Streaming: headers and a keep-alive event after this long without a result, then one every this long.
  keepalive_s: float = 5.0
  finish_timeout_s: float = 30.0  # POST /rollouts/{id}/finish waits this long for calls in flight.
  public_url: str | None = None  # Root for base_url when clients reach the server by another address.
  log_threads: int = 32  # Threads appending + fsyncing call records (I/O-bound: one per busy rollout).
  # Stream text and thinking as the engine samples them (`Backend.generate_streaming`). Off: each turn
  # goes out whole once generated, after keep-alives. Harnesses act the same either way; off saves the
  # shim ~80 us of CPU per token (engine events to parse, client events to send), which is what
  # training wants. On: someone watches a harness live.
  incremental_stream: bool = False


def _api_key(request: web.Request) -> str | None:
  key = request.headers.get("x-api-key")
  if key:
    return key
  auth = request.headers.get("Authorization", "")
  return auth[7:].strip() if auth.lower().startswith("bearer ") else None


def _reject_constant(name: str) -> Any:
  raise ValueError(f"{name} is not valid JSON")


def _decode_json(raw: bytes) -> Any:
  """A request body's JSON. orjson parses an ~80 KB Claude Code body 2-3x faster than `json` and, like
  us, rejects NaN/Infinity; but it also rejects lone UTF-16 surrogate escapes, which a JavaScript
  client sends when it cut a tool output inside an emoji. Those bodies take the `json` path, and each
  lone surrogate becomes U+FFFD (what any tokenizer needs: it encodes UTF-8)."""
  try:
    return orjson.loads(raw)
  except orjson.JSONDecodeError:
    pass
  try:
    return _without_lone_surrogates(json.loads(raw, parse_constant=_reject_constant))
  except ValueError as e:
    raise ApiError(errors.INVALID, f"request body is not valid JSON: {e}") from None


def _without_lone_surrogates(x: Any) -> Any:
  if isinstance(x, str):
    # json.loads already joined the valid pairs: what is left in the surrogate range is lone.
    return x.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
  if isinstance(x, list):
    return [_without_lone_surrogates(v) for v in x]
  if isinstance(x, dict):
    return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in x.items()}
  return x


def _json_response(body: Any, status: int = 200) -> web.Response:
  return web.Response(body=dumps(body).encode(), status=status, content_type="application/json")


class _TurnFeed:
  """One call's turn as the backend samples it. The ids go through the turn parser as they arrive (the
  same parser then gives the whole turn); when streaming incrementally, the events of what it settled
  wait in `pending` for the response loop, which `woken` wakes."""

  def __init__(self, parser: TurnStream, events: TurnEvents | None, incremental: bool):
    self.parser, self.events = parser, events
    self.streamed: list[int] = []
    self.pending: list[bytes] = []
    self.woken = asyncio.Event() if incremental else None

  def on_tokens(self, ids: Sequence[int]) -> None:
    """The backend's TokenSink (called on the event loop)."""
    self.streamed += ids
    data = self.events.deltas(self.parser.feed(ids))
    if data:
      self.pending.append(data)
      self.woken.set()

  def take(self) -> bytes:
    """The events not sent yet. (Clearing `woken` here, before the write: more may come during it.)"""
    data = b"".join(self.pending)
    self.pending.clear()
    if self.woken is not None:
      self.woken.clear()
    return data

  def check(self, gen: Generation, backend: str) -> None:
    if list(gen.output_ids[:len(self.streamed)]) != self.streamed:
      raise BackendError(f"{backend} streamed {len(self.streamed)} ids that are not the start of its "
                         f"{len(gen.output_ids)} output ids")

  def finish(self, gen: Generation) -> ParsedTurn:
    self.parser.feed(gen.output_ids[len(self.streamed):])
    return self.parser.finish()[1]


class ShimServer:
  """The shim as an aiohttp application; `start()`/`stop()` inside a running event loop."""

  def __init__(self, config: ShimConfig, backend: Backend, template: ChatTemplate,
               profiles: dict[str, HarnessProfile] | None = None):
    self.config, self.backend, self.template = config, backend, template
    self.profiles = profiles or {}
    self.registry = RolloutRegistry(config.log_dir)
    self._log_pool = concurrent.futures.ThreadPoolExecutor(config.log_threads,
                                                           thread_name_prefix="clawjax-log")
    self.anthropic, self.openai = AnthropicDialect(), OpenAIDialect()
    self.app = web.Application(client_max_size=config.max_body_bytes)
    self._runner: web.AppRunner | None = None
    self.url = ""
    routes = [("POST", "/v1/messages", self._messages),
              ("POST", "/v1/messages/count_tokens", self._count_tokens),
              ("POST", "/v1/chat/completions", self._chat_completions),
              ("GET", "/v1/models", self._models)]
    for method, path, handler in routes:
      self.app.router.add_route(method, path, handler)
      self.app.router.add_route(method, "/r/{rid}" + path, handler)
    self.app.router.add_post("/rollouts", self._create_rollout)
    self.app.router.add_post("/rollouts/{rid}/finish", self._finish_rollout)
    self.app.router.add_get("/rollouts/{rid}", self._get_rollout)
    self.app.router.add_get("/health", self._health)

  async def start(self) -> str:
    self._runner = web.AppRunner(self.app, access_log=None)
    await self._runner.setup()
    site = web.TCPSite(self._runner, self.config.host, self.config.port)
    await site.start()
    port = self._runner.addresses[0][1]
    self.url = self.config.public_url or f"http://{self.config.host}:{port}"
    return self.url

  async def stop(self) -> None:
    await self.registry.close(self.config.finish_timeout_s)
    if self._runner is not None:
      await self._runner.cleanup()
    await self.backend.close()
    self._log_pool.shutdown(wait=True)

  # ---- admin API

  async def create_rollout(self, task_id: str, harness: str, rollout_id: str | None = None
                           ) -> dict[str, Any]:
    """In-process form of POST /rollouts. `context_window` is the prompt + generation limit the shim
    enforces (`_max_context`): a harness compacts in time only if it knows it (the harness adapters
    pass it on), since a model name it does not recognise gets a window of up to 1M tokens."""
    window = await self._max_context()  # (Before registering: a failure here leaves no rollout.)
    profile = self.profiles.get(harness) or profile_for(harness)
    rollout = self.registry.create(task_id, harness, profile, PromptBuilder(self.template),
                                   rollout_id)
    base = f"{self.url}/r/{rollout.rollout_id}"
    return {"rollout_id": rollout.rollout_id, "base_url": base, "openai_base_url": base + "/v1",
            "api_key": rollout.api_key, "log_path": rollout.writer.path, "context_window": window}

  async def _create_rollout(self, request: web.Request) -> web.Response:
    try:
      body = json.loads(await request.read())
      if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
      fields = {k: body.get(k) for k in ("task_id", "harness", "rollout_id")}
      for k, val in fields.items():
        if (val is not None or k != "rollout_id") and not isinstance(val, str):
          raise ValueError(f"field {k!r} must be a string")
      return _json_response(await self.create_rollout(**fields))
    except web.HTTPRequestEntityTooLarge:
      return _json_response({"error": "request body too large"}, 413)
    except ValueError as e:
      return _json_response({"error": str(e)}, 400)

  async def _finish_rollout(self, request: web.Request) -> web.Response:
    rollout = await self.registry.finish(request.match_info["rid"], self.config.finish_timeout_s)
    if rollout is None:
      return _json_response({"error": "unknown rollout"}, 404)
    return _json_response(rollout.summary())

  async def _get_rollout(self, request: web.Request) -> web.Response:
    rollout = self.registry.get(request.match_info["rid"])
    if rollout is None:
      return _json_response({"error": "unknown rollout"}, 404)
    return _json_response(rollout.summary())

  async def _health(self, request: web.Request) -> web.Response:
    ok = await self.backend.health()
    return _json_response({"status": "ok" if ok else "backend unavailable",
                           "live_rollouts": len(self.registry.live())}, 200 if ok else 503)

  async def _models(self, request: web.Request) -> web.Response:
    name = self.config.model_name
    return _json_response({"object": "list", "has_more": False, "first_id": name, "last_id": name,
                           "data": [{"id": name, "object": "model", "type": "model",
                                     "display_name": name, "created": 0,
                                     "created_at": "1970-01-01T00:00:00Z", "owned_by": "clawjax"}]})

  # ---- model calls

  async def _messages(self, request: web.Request) -> web.StreamResponse:
    return await self._call(request, self.anthropic)

  async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
    return await self._call(request, self.openai)

  def _error(self, dialect: Dialect, err: ApiError) -> web.Response:
    return _json_response(dialect.error_body(err), err.status)

  async def _authorized_body(self, request: web.Request) -> tuple[Rollout, Any]:
    """The rollout and decoded JSON body of a model request, or ApiError (nothing is written)."""
    rollout = self.registry.lookup(_api_key(request), request.match_info.get("rid"))
    if rollout is None:
      raise ApiError(errors.AUTH, "invalid x-api-key: unknown or finished rollout")
    try:
      raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
      raise ApiError(errors.TOO_LARGE,
                     f"request body exceeds {self.config.max_body_bytes} bytes") from None
    return rollout, _decode_json(raw)

  async def _count_tokens(self, request: web.Request) -> web.Response:
    try:
      _, body = await self._authorized_body(request)
      req = parse_messages(body, need_max_tokens=False)
      ids = self.template.render(req.messages, req.tools, enable_thinking=req.enable_thinking)
    except ApiError as e:
      return self._error(self.anthropic, e)
    return _json_response({"input_tokens": len(ids)})

  async def _max_context(self) -> int:
    """--max-context, or the engine's own limit where that is smaller (`Backend.context_length`)."""
    engine = await self.backend.context_length()
    return self.config.max_context if engine is None else min(engine, self.config.max_context)

  def _too_long(self, n: int, limit: int) -> ApiError:
    return ApiError(errors.CONTEXT, f"prompt is too long: {n} tokens > {limit - 1} maximum "
                    f"(this model's maximum context length is {limit} tokens)")

  async def _call(self, request: web.Request, dialect: Dialect) -> web.StreamResponse:
    t_start = time.time()
    try:
      rollout, body = await self._authorized_body(request)
      req = dialect.parse_request(body, rollout.memos[dialect.name])
      if rollout.builder is None:
        raise ApiError(errors.AUTH, "rollout is finished")
      try:
        prompt = rollout.builder.build(req.messages, req.tools, enable_thinking=req.enable_thinking)
      except ValueError as e:
        raise ApiError(errors.INVALID, f"messages: {e}") from None
      input_ids = prompt.input_ids  # A fresh list per call: no copy needed.
      max_context = await self._max_context()
      if len(input_ids) >= max_context:
        raise self._too_long(len(input_ids), max_context)
    except ApiError as e:
      return self._error(dialect, e)
    max_new = min(req.max_tokens or self.config.max_new_tokens, self.config.max_new_tokens,
                  max_context - len(input_ids))
    params = SamplingParams(max_new_tokens=max_new, temperature=self.config.temperature,
                            top_p=self.config.top_p, top_k=self.config.top_k,
                            stop_token_ids=self.template.stop_token_ids)
    call_index = rollout.begin_call()
    try:
      return await self._generate_and_respond(request, dialect, rollout, req, prompt, input_ids,
                                              params, call_index, t_start)
    finally:
      rollout.end_call()

  async def _generate_and_respond(self, request: web.Request, dialect: Dialect, rollout: Rollout,
                                  req: ChatRequest, prompt: Any, input_ids: list[int],
                                  params: SamplingParams, call_index: int,
                                  t_start: float) -> web.StreamResponse:
    message_id = new_id("msg_" if dialect is self.anthropic else "chatcmpl-")
    # The call log's incremental encoding makes the ids' JSON cheap (new tokens only); the record and
    # a remote engine's request both use it.
    input_tuple = tuple(input_ids)  # The record's ids; the log writer caches it, uncopied.
    encoded = rollout.writer.encode_ids(input_tuple, call_index)
    feed = _TurnFeed(self.template.turn_stream(dialect.tool_id_prefix),
                     dialect.turn_events(message_id, self.config.model_name) if req.stream else None,
                     incremental=req.stream and self.config.incremental_stream)

    async def generate() -> tuple[Generation, float]:
      t = time.time()
      ids = PromptIds(input_tuple, encoded.engine_json)
      if feed.woken is None:
        gen = await self.backend.generate(ids, params)
      else:
        gen = await self.backend.generate_streaming(ids, params, feed.on_tokens)
        feed.check(gen, type(self.backend).__name__)
      return gen, time.time() - t

    gen_task = asyncio.ensure_future(generate())
    stream: web.StreamResponse | None = None
    disconnected = False

    async def send(data: bytes) -> None:
      nonlocal disconnected
      if data and not disconnected:
        try:
          await stream.write(data)
        except (ConnectionError, RuntimeError):
          disconnected = True  # Keep going: the generation is still logged.

    if req.stream:
      # Hold the headers back for one keep-alive interval (or until text streams), so a fast failure
      # still gets its status.
      await self._until(gen_task, feed.woken)
      if not gen_task.done():
        stream = await self._open_stream(request)
        await send(dialect.stream_head(message_id, self.config.model_name, len(input_ids)))
        while not gen_task.done():
          await send(feed.take() or dialect.keepalive())
          await self._until(gen_task, feed.woken)
    record = dict(rollout_id=rollout.rollout_id, task_id=rollout.task_id, harness=rollout.harness,
                  call_index=call_index, input_ids=input_tuple, role=rollout.profile.role(req),
                  model=self.config.model_name, t_start=t_start)
    extra = {"api": dialect.name, "stream": req.stream, "request_model": req.model,
             "max_new_tokens": params.max_new_tokens, "spliced_turns": prompt.spliced_turns,
             "drifted_turns": prompt.drifted_turns, "new_tokens": prompt.new_tokens}
    if req.client_sampling:
      extra["client_sampling"] = req.client_sampling
    try:
      gen, extra["backend_s"] = await gen_task  # backend_s: splits a call's time, engine vs shim.
    except Exception as e:  # A backend bug is still a backend failure: log it, answer 500.
      status = e.status if isinstance(e, BackendError) else 500
      overloaded = isinstance(e, BackendError) and e.overloaded
      err = ApiError(errors.OVERLOADED if overloaded else errors.INTERNAL, f"backend error: {e}",
                     status=(529 if dialect is self.anthropic else 503) if overloaded else 500)
      if not isinstance(e, BackendError):
        log.exception("backend raised")
      await self._write(rollout, encoded, CallRecord(
          **record, status="error", output_ids=(), output_logprobs=(), finish_reason=None,
          t_end=time.time(), policy_version=None,
          extra=dict(extra, error=str(e), backend_status=status)))
      if stream is None:
        return self._error(dialect, err)
      await send(feed.take() + dialect.stream_error(err))
      return stream
    turn = feed.finish(gen)
    rollout.builder.record_generation(prompt, gen.output_ids, turn)  # Open until end_call.
    if turn.malformed:
      extra["malformed_tool_calls"] = list(turn.malformed)
    if disconnected:
      extra["client_disconnected"] = True
    call = CallRecord(**record, status="ok", output_ids=tuple(gen.output_ids),
                      output_logprobs=tuple(gen.output_logprobs), finish_reason=gen.finish_reason,
                      t_end=time.time(), policy_version=gen.policy_version, extra=extra)
    written = self._start_write(rollout, encoded, call)
    result = ChatResult(turn, len(input_ids), len(gen.output_ids), gen.finish_reason)
    if not req.stream:
      await self._finish_write(rollout, encoded, call, written)
      return _json_response(dialect.response(result, self.config.model_name, message_id))
    try:  # Everything but the final event goes out while the record is being fsynced.
      head = b""
      if stream is None:  # (One write: aiohttp sends the headers with the first chunk.)
        stream = await self._open_stream(request)
        head = dialect.stream_head(message_id, self.config.model_name, len(input_ids))
      await send(head + feed.take() + feed.events.rest(result, req.include_usage))
    finally:
      await self._finish_write(rollout, encoded, call, written)
    await send(dialect.stream_final())
    return stream

  async def _until(self, gen_task: asyncio.Future, woken: asyncio.Event | None) -> None:
    """Waits for the generation, streamed text (`woken`) or one keep-alive interval, what comes first."""
    if woken is None:
      await asyncio.wait({gen_task}, timeout=self.config.keepalive_s)
      return
    waiter = asyncio.ensure_future(woken.wait())
    await asyncio.wait({gen_task, waiter}, timeout=self.config.keepalive_s,
                       return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()

  async def _open_stream(self, request: web.Request) -> web.StreamResponse:
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                         "Cache-Control": "no-cache"})
    await stream.prepare(request)
    return stream

  def _start_write(self, rollout: Rollout, encoded: EncodedInput, record: CallRecord
                   ) -> asyncio.Future:
    """Builds and validates the record's line here, and appends + fsyncs it on a log thread (the disk
    blocks; other rollouts' calls keep flowing). Returns the future of the fsync."""
    line = rollout.writer.call_line(record, encoded)
    return asyncio.get_running_loop().run_in_executor(self._log_pool, rollout.writer.append, line)

  async def _finish_write(self, rollout: Rollout, encoded: EncodedInput, record: CallRecord,
                          written: asyncio.Future) -> None:
    """While the disk works: cache this call's encoding for the next call. Then wait for the fsync."""
    rollout.writer.remember(record, encoded)
    await written
    rollout.note_written(record)

  async def _write(self, rollout: Rollout, encoded: EncodedInput, record: CallRecord) -> None:
    await self._finish_write(rollout, encoded, record, self._start_write(rollout, encoded, record))


class ShimThread:
  """Runs a ShimServer on its own event loop thread (tests, synchronous callers).

  with ShimThread(config, backend, template) as shim: shim.url, shim.create_rollout(...)
  """

  def __init__(self, config: ShimConfig, backend: Backend, template: ChatTemplate,
               profiles: dict[str, HarnessProfile] | None = None):
    self.server = ShimServer(config, backend, template, profiles)
    self.loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="clawjax-shim")

  @property
  def url(self) -> str:
    return self.server.url

  def run(self, coro) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

  def create_rollout(self, task_id: str, harness: str, rollout_id: str | None = None
                     ) -> dict[str, Any]:
    return self.run(self.server.create_rollout(task_id, harness, rollout_id))

  def finish_rollout(self, rollout_id: str) -> dict[str, Any] | None:
    async def finish():
      rollout = await self.server.registry.finish(rollout_id, self.server.config.finish_timeout_s)
      return rollout.summary() if rollout else None
    return self.run(finish())

  def start(self) -> "ShimThread":
    self._thread.start()
    self.run(self.server.start())
    return self

  def stop(self) -> None:
    self.run(self.server.stop())
    self.loop.call_soon_threadsafe(self.loop.stop)
    self._thread.join()
    self.loop.close()

  def __enter__(self) -> "ShimThread":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()
