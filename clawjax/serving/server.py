"""The shim's HTTP server: control routes, the three API dialects, call-log writing.

Routes (every model route also exists under the per-rollout prefix `/r/{rollout_id}`, which is what
`POST /rollouts` hands out as `base_url`; without the prefix the rollout is found by its key alone):
  POST /v1/messages[?beta=true]     Anthropic Messages      POST /v1/messages/count_tokens
  POST /v1/chat/completions         OpenAI Chat Completions GET  /v1/models
  POST /v1/responses                OpenAI Responses
  POST /rollouts {task_id, harness[, rollout_id]}
      -> {rollout_id, base_url, openai_base_url, api_key, log_path, context_window}
  POST /rollouts/{id}/finish        GET /rollouts/{id}      GET /health
The control routes (`/rollouts...`) need the admin token (`Authorization: Bearer TOKEN`, see
clawjax/auth.py): 401 without one, 403 with any other. A model route needs a rollout's key, which opens
that rollout only.

A call: authenticate (401, nothing written) -> check the call log can take a record (503) -> read the
body under a size and a time limit (413, 408) -> decode it under a nesting limit and validate (400) ->
build the prompt token-in-token-out (400 "prompt is too long" past --max-context) -> generate on the
backend, sending keep-alives (or, with `incremental_stream`, the text so far) while it runs (a client
found gone meanwhile cancels the generation: an `error` record, `client_disconnected`) -> parse
the turn -> append the call record -> send the rest of the turn. Write-then-acknowledge: the final
response bytes (a JSON body, a stream's last event) go out only once the record is on disk, whole and
fsynced; a record that cannot be written turns the answer into the API's error (a stream ends with an
`error` event instead of its last event) and marks the rollout failed. A backend failure is answered in
the API's error shape and logged as an `error` record. Every error the shim sends, 500s included, is in
the dialect's shape (the control routes use OpenAI's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Sequence
from typing import Annotated, Any

from aiohttp import web

from clawjax.auth import bearer_token, new_token
from clawjax.calllog import CallRecord
from clawjax.config import ConfigError, Count, NonNegative, Positive, Range
from clawjax.generation import Generation, SamplingParams
from clawjax.serving import errors
from clawjax.serving.anthropic_api import AnthropicDialect, parse_messages
from clawjax.serving.backends.base import Backend, BackendError, PromptIds
from clawjax.serving.chat import ChatRequest, ChatResult, Dialect, TurnEvents, new_id
from clawjax.serving.errors import ApiError
from clawjax.serving.intake import ClientCappedSite, read_json
from clawjax.serving.logspace import LogSpace
from clawjax.serving.logwriter import EncodedInput, own_routes
from clawjax.serving.openai_api import OpenAIDialect
from clawjax.serving.openai_responses import ResponsesDialect
from clawjax.serving.profiles import HarnessProfile, profile_for
from clawjax.serving.responses import add_control_routes, error_middleware, error_response, json_response
from clawjax.serving.rollouts import Rollout, RolloutRegistry
from clawjax.text.messages import ParsedTurn
from clawjax.text.prompt import Prompt, PromptBuilder
from clawjax.text.templates import ChatTemplate
from clawjax.text.turn_stream import TurnStream

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # an error record's backend_status when the client left mid-stream (nginx's code for it)

# The model routes, each also under the per-rollout prefix /r/{rid}.
MODEL_ROUTES = ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions", "/v1/responses",
                "/v1/models")


@dataclasses.dataclass
class ShimConfig:
  """Server settings. Sampling settings apply to every call whatever the client asks, so the rollout
  distribution (and the log-probs' temperature) is the one the trainer expects."""
  log_dir: str
  model_name: str = "policy"  # Reported in responses and logged as CallRecord.model.
  host: str = "127.0.0.1"
  port: Annotated[int, Range(low=0, high=65535)] = 0  # 0: any free port.
  max_new_tokens: Count = 8192  # The paper's recipe; Claude Code asks for 32K-128K.
  # Prompt + generation budget; longer prompts get "prompt is too long". An engine that tells a smaller
  # limit of its own (vLLM's --max-model-len, the embedded engine's max_seq_len) sets it instead. The
  # paper's 64K: Claude Code, told this window, compacts from the window less 33K tokens on (its output
  # and summary reserves), so at 32K it would compact after every tool call.
  max_context: Count = 65536
  temperature: NonNegative[float] = 1.0
  top_p: Annotated[float, Range(low=0, high=1, open_low=True)] = 1.0
  top_k: int = -1
  # Largest request body, checked from Content-Length and then while reading, before any parsing or
  # tokenising (413). Claude Code sends ~75 KB; images can reach a few MB; the Messages API's own limit.
  max_body_bytes: Count = 32 * 1024 * 1024
  # A request's headers must arrive within this long of its connection opening (or of the previous
  # response on it), and then its body within this long (408); an idle keep-alive connection is closed
  # after it too (clients reconnect: Node's and Python's HTTP clients drop idle ones after ~5 s).
  read_timeout_s: Positive[float] = 30.0
  # Open connections from one client address; more are closed at once. Sandboxed harnesses reach the
  # shim through their relays from 127.0.0.1, so on one host this bounds all rollouts together: keep it
  # above rollouts in flight x connections per harness (a few). With workers > 1: per process (the
  # front's and each worker's own).
  max_connections_per_client: Count = 1024
  max_json_depth: Count = 128  # Nesting levels of a request body's JSON (400 past it); tool schemas use ~10.
  # Free space the call log's filesystem must keep: below it, model calls and new rollouts are refused
  # with 503 (retryable) rather than accepted and not recorded. A call's record is ~2 KB (a rollout's
  # first, ~150 KB); 256 MiB holds a thousand rollouts' first calls.
  min_free_log_bytes: NonNegative[int] = 256 * 1024 * 1024
  # fsync each call record before its final response bytes (it is always written first). Off: a record
  # acknowledged just before a power loss can be lost (a shim crash loses nothing either way).
  fsync_call_log: bool = True
  # Streaming: headers and a keep-alive event after this long without a result, then one every this long.
  keepalive_s: Positive[float] = 5.0
  finish_timeout_s: Positive[float] = 30.0  # POST /rollouts/{id}/finish waits this long for calls in flight.
  # Root for base_url when clients reach the server by another address. With workers > 1 it is the
  # front's, and a worker's base_url is its scheme and host with the worker's own port.
  public_url: str | None = None
  log_threads: Count = 32  # Threads appending + fsyncing call records (I/O-bound: one per busy rollout).
  # Stream text and thinking as the engine samples them (`Backend.generate_streaming`). Off: each turn
  # goes out whole once generated, after keep-alives. Harnesses act the same either way; off saves the
  # shim ~80 us of CPU per token (engine events to parse, client events to send), which is what
  # training wants. On: someone watches a harness live.
  incremental_stream: bool = False
  # Shim processes on this host. 1: one process serves everything (the control and model routes on one
  # event loop, as `ShimServer`/`ShimThread`). N > 1: a front process answers the control routes and
  # N worker processes the model routes, each rollout pinned at `POST /rollouts` to the worker with
  # the fewest live rollouts, its base_url that worker's own port (`clawjax.serving.front`). One event
  # loop runs out of CPU at ~100 concurrent rollouts (~5 ms of CPU per call); N of them share the calls,
  # given N free cores. Needs a backend other processes reach (sglang, vllm, scripted), not `embedded`.
  workers: Count = 1
  # With workers > 1: how long a worker process may take to start (imports, tokenizer, backend) before
  # the shim gives up on it.
  worker_start_timeout_s: Positive[float] = 60.0

  def __post_init__(self):
    if self.workers < 1:
      raise ConfigError(f"shim.workers: must be at least 1 (shim processes), got {self.workers}")


def _api_key(request: web.Request) -> str | None:
  return request.headers.get("x-api-key") or bearer_token(request.headers)


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


@dataclasses.dataclass
class _Call:
  """One model call from its validated request to its answer: what its record and its response need."""
  request: web.Request
  dialect: Dialect
  rollout: Rollout
  req: ChatRequest
  prompt: Prompt
  input_ids: tuple[int, ...]  # The record's ids; the log writer caches them, uncopied.
  params: SamplingParams
  index: int
  t_start: float
  model: str
  message_id: str
  encoded: EncodedInput  # The ids' JSON, for the engine request and the log line.
  feed: _TurnFeed
  extra: dict[str, Any]  # The record's `extra` known before generation.
  stream: web.StreamResponse | None = None  # Once the event stream's headers went out.
  disconnected: bool = False

  async def open_stream(self) -> bytes:
    """Starts the event stream (aiohttp sends its headers with the first write); returns the dialect's
    first events, for that write."""
    self.stream = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                              "Cache-Control": "no-cache"})
    await self.stream.prepare(self.request)
    return self.feed.events.head(len(self.input_ids))

  async def send(self, data: bytes) -> None:
    if data and not self.disconnected:
      try:
        await self.stream.write(data)
      except (ConnectionError, RuntimeError):
        self.disconnected = True  # A generation still running is cancelled; a finished one is still logged.

  def record(self, **fields: Any) -> CallRecord:
    r = self.rollout
    return CallRecord(rollout_id=r.rollout_id, task_id=r.task_id, harness=r.harness, call_index=self.index,
                      input_ids=self.input_ids, role=r.profile.role(self.req), model=self.model,
                      t_start=self.t_start, t_end=time.time(), **fields)


class ShimServer:
  """The shim as an aiohttp application; `start()`/`stop()` inside a running event loop. `admin_token`
  opens the control routes (a fresh random one when not given)."""

  def __init__(self, config: ShimConfig, backend: Backend, template: ChatTemplate,
               profiles: dict[str, HarnessProfile] | None = None, admin_token: str | None = None):
    self.config, self.backend, self.template = config, backend, template
    self.profiles = profiles or {}
    self.admin_token = admin_token or new_token()
    self.registry = RolloutRegistry(config.log_dir, fsync=config.fsync_call_log)
    self.log_space = LogSpace(config.log_dir, config.min_free_log_bytes)
    self._log_pool = concurrent.futures.ThreadPoolExecutor(config.log_threads,
                                                           thread_name_prefix="clawjax-log")
    self.anthropic, self.openai, self.responses = AnthropicDialect(), OpenAIDialect(), ResponsesDialect()
    self.app = web.Application(client_max_size=config.max_body_bytes,
                               middlewares=[error_middleware(self.anthropic, self.openai)])
    self._runner: web.AppRunner | None = None
    self.url = ""
    handlers = {"/v1/messages": ("POST", self._messages),
                "/v1/messages/count_tokens": ("POST", self._count_tokens),
                "/v1/chat/completions": ("POST", self._chat_completions),
                "/v1/responses": ("POST", self._responses), "/v1/models": ("GET", self._models)}
    for path in MODEL_ROUTES:
      method, handler = handlers[path]
      self.app.router.add_route(method, path, handler)
      self.app.router.add_route(method, "/r/{rid}" + path, handler)
    add_control_routes(self.app, self)
    self.app.router.add_get("/health", self._health)

  async def start(self, sock: socket.socket | None = None) -> str:
    """Serves on config.host:config.port, or on `sock` (a listening socket: a worker's, made by the
    front); raises OSError naming the call log directory when it is not writable."""
    self.log_space.check_writable()
    if problem := self.log_space.problem():
      log.warning("%s: model calls get 503 until space returns", problem)
    # aiohttp's keep-alive timer also closes a connection that has not sent a whole request in time.
    self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=self.config.read_timeout_s)
    await self._runner.setup()
    site = ClientCappedSite(self._runner, self.config.host, self.config.port,
                            self.config.max_connections_per_client, sock)
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

  async def _json_body(self, request: web.Request) -> Any:
    return await read_json(request, self.config.max_body_bytes, self.config.read_timeout_s,
                           self.config.max_json_depth)

  def _check_log_space(self) -> None:
    if problem := self.log_space.problem():
      raise ApiError(errors.UNAVAILABLE, f"the shim cannot record calls now: {problem}; retry later")

  # ---- control routes

  async def create_rollout(self, task_id: str, harness: str, rollout_id: str | None = None
                           ) -> dict[str, Any]:
    """In-process form of POST /rollouts. `context_window` is the prompt + generation limit the shim
    enforces (`_max_context`): a harness compacts in time only if it knows it (the harness adapters
    pass it on), since a model name it does not recognise gets a window of up to 1M tokens. Raises
    ApiError(503) when the call log cannot take records, ValueError for a bad or taken id."""
    self._check_log_space()
    window = await self._max_context()  # (Before registering: a failure here leaves no rollout.)
    profile = self.profiles.get(harness) or profile_for(harness)
    rollout = self.registry.create(task_id, harness, profile, PromptBuilder(self.template),
                                   rollout_id)
    base = f"{self.url}/r/{rollout.rollout_id}"
    return {"rollout_id": rollout.rollout_id, "base_url": base, "openai_base_url": base + "/v1",
            "api_key": rollout.api_key, "log_path": rollout.writer.path, "context_window": window}

  async def finish_rollout(self, rollout_id: str) -> dict[str, Any] | None:
    """In-process form of POST /rollouts/{id}/finish: the summary once the rollout's calls in flight
    are logged (or `finish_timeout_s` passed); None for an unknown rollout."""
    rollout = await self.registry.finish(rollout_id, self.config.finish_timeout_s)
    return rollout.summary() if rollout else None

  async def rollout_summary(self, rollout_id: str) -> dict[str, Any] | None:
    """In-process form of GET /rollouts/{id} (None: unknown rollout)."""
    rollout = self.registry.get(rollout_id)
    return rollout.summary() if rollout else None

  async def _health(self, request: web.Request) -> web.Response:
    ok = await self.backend.health()
    return json_response({"status": "ok" if ok else "backend unavailable",
                          "live_rollouts": len(self.registry.live())}, 200 if ok else 503)

  async def _models(self, request: web.Request) -> web.Response:
    name = self.config.model_name
    return json_response({"object": "list", "has_more": False, "first_id": name, "last_id": name,
                           "data": [{"id": name, "object": "model", "type": "model",
                                     "display_name": name, "created": 0,
                                    "created_at": "1970-01-01T00:00:00Z", "owned_by": "clawjax"}]})

  # ---- model calls

  async def _messages(self, request: web.Request) -> web.StreamResponse:
    return await self._call(request, self.anthropic)

  async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
    return await self._call(request, self.openai)

  async def _responses(self, request: web.Request) -> web.StreamResponse:
    return await self._call(request, self.responses)

  def _rollout_of(self, request: web.Request) -> Rollout:
    """The rollout a model request's key opens (ApiError 401 otherwise; nothing is written)."""
    rid = request.match_info.get("rid")
    rollout = self.registry.lookup(_api_key(request), rid)
    if rollout is None:
      lost = self.registry.lost.get(rid)
      raise ApiError(errors.AUTH, f"rollout {rid} is lost: {lost}" if lost
                     else "invalid x-api-key: unknown or finished rollout")
    return rollout

  async def _count_tokens(self, request: web.Request) -> web.Response:
    self._rollout_of(request)
    req = parse_messages(await self._json_body(request), need_max_tokens=False)
    ids = self.template.render(req.messages, req.tools, enable_thinking=req.enable_thinking)
    return json_response({"input_tokens": len(ids)})

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
      rollout = self._rollout_of(request)
      self._check_log_space()
      req = dialect.parse_request(await self._json_body(request), rollout.memos[dialect.name])
      if rollout.builder is None:
        raise ApiError(errors.AUTH, "rollout is finished")
      try:
        prompt = rollout.builder.build(req.messages, req.tools, enable_thinking=req.enable_thinking)
      except ValueError as e:
        raise ApiError(errors.INVALID, f"messages: {e}") from None
      max_context = await self._max_context()
      if len(prompt.input_ids) >= max_context:
        raise self._too_long(len(prompt.input_ids), max_context)
    except ApiError as e:
      return error_response(dialect, e)
    input_ids = tuple(prompt.input_ids)
    max_new = min(req.max_tokens or self.config.max_new_tokens, self.config.max_new_tokens,
                  max_context - len(input_ids))
    params = SamplingParams(max_new_tokens=max_new, temperature=self.config.temperature,
                            top_p=self.config.top_p, top_k=self.config.top_k,
                            stop_token_ids=self.template.stop_token_ids)
    extra = {"api": dialect.name, "stream": req.stream, "request_model": req.model,
             "max_new_tokens": params.max_new_tokens, "spliced_turns": prompt.spliced_turns,
             "drifted_turns": prompt.drifted_turns, "new_tokens": prompt.new_tokens}
    if req.client_sampling:
      extra["client_sampling"] = req.client_sampling
    if req.metadata:
      extra["harness_metadata"] = req.metadata
    index = rollout.begin_call()
    try:
      message_id = new_id(dialect.message_id_prefix)
      model = self.config.model_name
      feed = _TurnFeed(self.template.turn_stream(dialect.tool_id_prefix),
                       dialect.turn_events(message_id, model, req) if req.stream else None,
                       incremental=req.stream and self.config.incremental_stream)
      # The call log's incremental encoding makes the ids' JSON cheap (new tokens only); the record
      # and a remote engine's request both use it.
      call = _Call(request, dialect, rollout, req, prompt, input_ids, params, index, t_start, model,
                   message_id, rollout.writer.encode_ids(input_ids, index), feed, extra)
      gen_task = asyncio.ensure_future(self._generate(call))
      if req.stream:
        await self._stream_while_generating(call, gen_task)
      try:
        gen, backend_s = await gen_task
      except asyncio.CancelledError:
        if not (call.disconnected and gen_task.cancelled()):
          raise  # (this handler's own cancellation)
        return await self._fail(call, BackendError("the client disconnected mid-stream: generation cancelled",
                                                   status=CLIENT_CLOSED))
      except Exception as e:  # pylint: disable=broad-except  (a backend bug is a backend failure too)
        return await self._fail(call, e)
      return await self._succeed(call, gen, backend_s)
    finally:
      rollout.end_call()

  async def _generate(self, call: _Call) -> tuple[Generation, float]:
    """The backend's generation and its seconds (`backend_s`: splits a call's time, engine vs shim)."""
    t = time.time()
    prompt = PromptIds(call.input_ids, call.encoded.engine_json, routing_key=call.rollout.rollout_id,
                       routes_from=call.encoded.routes_from)
    if call.feed.woken is None:
      gen = await self.backend.generate(prompt, call.params)
    else:
      gen = await self.backend.generate_streaming(prompt, call.params, call.feed.on_tokens)
      call.feed.check(gen, type(self.backend).__name__)
    return gen, time.time() - t

  async def _stream_while_generating(self, call: _Call, gen_task: asyncio.Future) -> None:
    """Holds the headers back for one keep-alive interval (or until text streams), so a fast failure
    still gets its status; then streams the text so far, or a keep-alive, each interval. A client found
    gone cancels the generation: nobody would read it (a harness retries the call), and the engine's
    slot goes to other calls."""
    await self._until(gen_task, call.feed.woken)
    if gen_task.done():
      return
    await call.send(await call.open_stream())
    while not gen_task.done():
      await call.send(call.feed.take() or call.feed.events.keepalive())
      if call.disconnected:
        gen_task.cancel()
        return
      await self._until(gen_task, call.feed.woken)

  async def _until(self, gen_task: asyncio.Future, woken: asyncio.Event | None) -> None:
    """Waits for the generation, streamed text (`woken`) or one keep-alive interval, what comes first."""
    if woken is None:
      await asyncio.wait({gen_task}, timeout=self.config.keepalive_s)
      return
    waiter = asyncio.ensure_future(woken.wait())
    await asyncio.wait({gen_task, waiter}, timeout=self.config.keepalive_s,
                       return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()

  async def _fail(self, call: _Call, e: Exception) -> web.StreamResponse:
    """A failed generation: an `error` record, and the API's error (an `error` event once streaming)."""
    status = e.status if isinstance(e, BackendError) else 500
    if isinstance(e, BackendError) and e.overloaded:
      err = ApiError(errors.OVERLOADED, f"backend error: {e}", status=call.dialect.overloaded_status)
    else:
      err = ApiError(errors.INTERNAL, f"backend error: {e}", status=500)
      if not isinstance(e, BackendError):
        log.exception("backend raised")
    extra = dict(call.extra, error=str(e), backend_status=status)
    if call.disconnected:
      extra["client_disconnected"] = True
    record = call.record(status="error", output_ids=(), output_logprobs=(), finish_reason=None,
                         policy_version=None, extra=extra)
    # (The answer is this error whether or not its record could be written.)
    await self._finish_store(call, record, self._start_store(call, record))
    if call.stream is None:
      return error_response(call.dialect, err)
    await call.send(call.feed.take() + call.feed.events.error(err))
    return call.stream

  async def _succeed(self, call: _Call, gen: Generation, backend_s: float) -> web.StreamResponse:
    """A generated turn: its `ok` record, then the turn, whose final bytes wait for the record."""
    turn = call.feed.finish(gen)
    call.rollout.builder.record_generation(call.prompt, gen.output_ids, turn)  # Open until end_call.
    extra = dict(call.extra, backend_s=backend_s)
    if gen.cached_tokens is not None:
      extra["cached_tokens"] = gen.cached_tokens
    if turn.malformed:
      extra["malformed_tool_calls"] = list(turn.malformed)
    if call.disconnected:
      extra["client_disconnected"] = True
    routes, problem = own_routes(gen.routed_experts, call.encoded.routes_from,
                                 len(call.input_ids) + len(gen.output_ids) - 1)
    if problem:
      extra["routes_dropped"] = problem
    record = call.record(status="ok", output_ids=tuple(gen.output_ids),
                         output_logprobs=tuple(gen.output_logprobs), finish_reason=gen.finish_reason,
                         policy_version=gen.policy_version, extra=extra, routed_experts=routes)
    stored = self._start_store(call, record)
    result = ChatResult(turn, len(call.input_ids), len(gen.output_ids), gen.finish_reason)
    if not call.req.stream:
      failure = await self._finish_store(call, record, stored)
      if failure is not None:
        return error_response(call.dialect, failure)
      return json_response(call.dialect.response(result, call.req, call.model, call.message_id))
    try:  # Everything but the final event goes out while the record is being written.
      head = b"" if call.stream is not None else await call.open_stream()
      await call.send(head + call.feed.take() + call.feed.events.rest(result))
    finally:
      failure = await self._finish_store(call, record, stored)
    await call.send(call.feed.events.final() if failure is None else call.feed.events.error(failure))
    return call.stream

  def _start_store(self, call: _Call, record: CallRecord) -> asyncio.Future:
    """Builds and validates the record's line here, and appends + fsyncs it on a log thread (the disk
    blocks; other rollouts' calls keep flowing). Returns the future of the write."""
    loop = asyncio.get_running_loop()
    try:
      line = call.rollout.writer.call_line(record, call.encoded)
    except ValueError as e:  # A record the shim built that does not validate: not stored either.
      log.exception("call record does not validate")
      failed = loop.create_future()
      failed.set_exception(e)
      return failed
    return loop.run_in_executor(self._log_pool, call.rollout.writer.append, line)

  async def _finish_store(self, call: _Call, record: CallRecord, stored: asyncio.Future
                          ) -> ApiError | None:
    """While the disk works: this call's cache entry for the next call. Once the record is on disk, the
    entry is cached and the call counted in the rollout's summary. A record that could not be written
    marks the rollout failed; the error to answer with is returned."""
    entry = call.rollout.writer.cache_entry(record, call.encoded)
    try:
      await stored
    except (OSError, ValueError) as e:
      reason = f"call {record.call_index} could not be recorded: {e}"
      log.error("rollout %s: %s", call.rollout.rollout_id, reason)
      call.rollout.fail(reason)
      return ApiError(errors.INTERNAL, f"the shim could not record this call ({e}); it is not answered")
    call.rollout.writer.remember(entry)
    call.rollout.note_written(record)
    return None


class ServerThread:
  """Runs a shim server on its own event loop thread (tests, synchronous callers): `server` has
  `start()`, `stop()`, `create_rollout(...)`, `finish_rollout(id)` coroutines, `url`, `admin_token` and
  `config`. `ShimThread` runs one `ShimServer`; `front.ShimProcessPool` the front of several worker
  processes. `run(coro)` runs any coroutine on the server's loop (the run layer's weight pushes through
  its backend)."""

  def __init__(self, server: Any):
    self.server = server
    self.loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="clawjax-shim")

  @property
  def url(self) -> str:
    return self.server.url

  @property
  def admin_token(self) -> str:
    """The token of the control routes over HTTP (`run_rollout(..., admin_token=...)`)."""
    return self.server.admin_token

  def run(self, coro) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

  def create_rollout(self, task_id: str, harness: str, rollout_id: str | None = None
                     ) -> dict[str, Any]:
    return self.run(self.server.create_rollout(task_id, harness, rollout_id))

  def finish_rollout(self, rollout_id: str) -> dict[str, Any] | None:
    return self.run(self.server.finish_rollout(rollout_id))

  def start(self) -> "ServerThread":
    self._thread.start()
    try:
      self.run(self.server.start())
    except BaseException:
      self._close_loop()
      raise
    return self

  def stop(self) -> None:
    try:
      self.run(self.server.stop())
    finally:
      self._close_loop()

  def _close_loop(self) -> None:
    self.loop.call_soon_threadsafe(self.loop.stop)
    self._thread.join()
    self.loop.close()

  def __enter__(self) -> "ServerThread":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()


class ShimThread(ServerThread):
  """One ShimServer (ShimConfig.workers == 1) on its own event loop thread.

  with ShimThread(config, backend, template) as shim: shim.url, shim.admin_token, shim.create_rollout(...)
  """

  def __init__(self, config: ShimConfig, backend: Backend, template: ChatTemplate,
               profiles: dict[str, HarnessProfile] | None = None, admin_token: str | None = None):
    if config.workers != 1:
      raise ConfigError(f"shim.workers={config.workers}: ShimThread runs one in-process server; several "
                        "worker processes run with clawjax.serving.front.ShimProcessPool")
    super().__init__(ShimServer(config, backend, template, profiles, admin_token))
