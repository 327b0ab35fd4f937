"""An HTTP server speaking SGLang's native protocol in front of an `Engine`, behaving as SGLang 0.5.23 does
where a client can tell, so a real SGLang server on a GPU is a drop-in replacement and a client that
works here works there (docs/engine.md has the table of what was checked against which SGLang file).

Routes (the subset of SGLang's API the shim's `sglang` backend uses, same JSON shapes):
  POST /generate {input_ids: list[int] | list[list[int]], sampling_params: {max_new_tokens, temperature,
      top_p, top_k, stop_token_ids, ignore_eos, sampling_seed}, return_logprob, stream,
      return_routed_experts, routed_experts_start_len}
      -> {text, output_ids, meta_info: {id, finish_reason: {type, ...}, prompt_tokens,
          completion_tokens, cached_tokens, output_token_logprobs: [[logprob, id, null], ...],
          weight_version, routed_experts}} (a list of those for a batch of inputs); routed_experts (on a
          stream's last event) only from an engine recording routes (--record-routes, or SGLang's
          --enable-return-routed-experts), in SGLang's format (routes_wire.py)
  GET  /health, /health_generate -> 200
  GET  /v1/models -> {object: "list", data: [{id: model path, object: "model", owned_by: "sglang", root}]}
  POST /update_weights_from_disk {model_path, weight_version, abort_all_requests, flush_cache}
      -> {success, message, num_paused_requests}
  GET|POST /flush_cache[?timeout=S] -> 200 "Cache flushed..." | 400 "Flush cache failed." (text)
  GET  /model_info -> {model_path, tokenizer_path, is_generation, weight_version, ...}; /get_model_info
      the same (SGLang's deprecated name for it, kept for older clients)

A weight update holds new requests and waits for those in flight (SGLang's model-update lock,
update_lock.py), or first ends them with finish_reason "abort" when its body asks
(`abort_all_requests: true`); it loads the weights and clears the prefix cache while nothing runs
(SGLang's `flush_cache`, true by default: this server always clears it), then lets the held requests
run. `/flush_cache` flushes only an idle engine: with requests queued or running it answers 400, or
with `?timeout=S` waits up to S seconds for idle. `weight_version` is SGLang's string: "default" until an
update names one; an update without one keeps the version of the weights it replaces; any string is
taken, also one naming a lower step (a trainer resumed from a checkpoint older than the weights held).
The control routes (/update_weights_from_disk, /flush_cache) need the admin token, sent as SGLang's
`--admin-api-key` is: `Authorization: Bearer TOKEN` (401 without one, 403 with another; clawjax/auth.py).
As in SGLang, generation stops at the model's EOS token unless `ignore_eos` is true. `text` is decoded
only when the server has a tokenizer; otherwise it is "". `stream: true` (one prompt) answers in
SGLang's event-stream format as with `--incremental-streaming-output`: an event per sampled token, the
last one carrying the finish reason; an aborted request ends with SGLang's abort event, output_ids
[the last token] (sent already) beside the log-probs of all of them. Text prompts are not supported
(400): the shim always sends token ids.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from clawjax.auth import admin_status, new_token
from clawjax.engine.engine import Engine, EngineError, Result
from clawjax.engine.routes_wire import RoutesRequest, sglang_routed_experts
from clawjax.engine.update_lock import UpdateLock
from clawjax.generation import SamplingParams

log = logging.getLogger(__name__)

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's own default when a request omits max_new_tokens


class BadRequest(EngineError):
  pass


def _field(obj: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any, where: str) -> Any:
  value = obj.get(name, default)
  if value is None:
    return default
  if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
    raise BadRequest(f"{where}.{name}: expected {'/'.join(k.__name__ for k in kinds)}, got {value!r}")
  return value


def _token_list(value: Any, where: str) -> list[int]:
  if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in value):
    raise BadRequest(f"{where}: expected a list of token ids")
  return value


def parse_sampling(body: dict[str, Any], eos_token_id: int | None) -> SamplingParams:
  sp = body.get("sampling_params") or {}
  if not isinstance(sp, dict):
    raise BadRequest("sampling_params: expected an object")
  where = "sampling_params"
  stop = list(_token_list(_field(sp, "stop_token_ids", (list,), [], where), f"{where}.stop_token_ids"))
  if eos_token_id is not None and not _field(sp, "ignore_eos", (bool,), False, where):
    stop.append(eos_token_id)
  return SamplingParams(
      max_new_tokens=_field(sp, "max_new_tokens", (int,), SGLANG_DEFAULT_MAX_NEW_TOKENS, where),
      temperature=float(_field(sp, "temperature", (int, float), 1.0, where)),
      top_p=float(_field(sp, "top_p", (int, float), 1.0, where)),
      top_k=_field(sp, "top_k", (int,), -1, where),
      stop_token_ids=tuple(stop),
      seed=_field(sp, "sampling_seed", (int,), None, where))


def _finish_reason(result: Result, max_new_tokens: int) -> dict[str, Any]:
  if result.finish_reason == "stop":
    return {"type": "stop", "matched": result.output_ids[-1]}
  if result.finish_reason == "length":
    return {"type": "length", "length": max_new_tokens}
  return {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def _event(obj: Any) -> bytes:
  return b"data: " + json.dumps(obj).encode() + b"\n\n"


# SGLang's answers to /flush_cache (http_server.py, scheduler_components/flush_wrapper.py).
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
           "requests, the operation will not be performed.)\n")
FLUSH_FAILED = "Flush cache failed.\n"
FLUSH_TIMED_OUT = "Timed out waiting for idle state."
FLUSH_BUSY = "Another flush_cache is already in progress."
IDLE_POLL_S = 0.005


class EngineServer:
  """The aiohttp application; `reload(model_path, version)` loads new weights into the engine as its
  policy `version` (Engine.update_from_model).
  `admin_token` opens the control routes (a fresh random one when not given).

  The engine counts its own versions, one more with every update, so that a request's result tells
  which update's weights sampled it even when two updates are reported under one weight_version (an
  unnamed update, a trainer naming its step again) or a later update names a lower one. `_reported`
  maps the engine's count to the weight_version the server reports."""

  def __init__(self, engine: Engine, model_path: str, reload: Callable[[str, int], object],
               eos_token_id: int | None = None, decode: Callable[[list[int]], str] | None = None,
               admin_token: str | None = None):
    self.engine, self.model_path, self.reload = engine, model_path, reload
    self.eos_token_id, self.decode = eos_token_id, decode
    self.admin_token = admin_token or new_token()
    self._reported: dict[int, str] = {engine.version: "default"}
    self._ids = itertools.count()
    self.update_lock = UpdateLock()
    self._flush_waiting = False
    self.app = web.Application(client_max_size=1 << 30, middlewares=[self._errors])
    self.app.add_routes([
        web.post("/generate", self.generate), web.get("/health", self.health),
        web.get("/health_generate", self.health), web.post("/flush_cache", self.flush_cache),
        web.get("/flush_cache", self.flush_cache),
        web.post("/update_weights_from_disk", self.update_weights_from_disk),
        web.get("/model_info", self.model_info), web.get("/get_model_info", self.get_model_info),
        web.get("/v1/models", self.models)])

  @web.middleware
  async def _errors(self, request: web.Request, handler):
    try:
      return await handler(request)
    except EngineError as e:
      return web.json_response({"error": {"message": str(e), "code": e.status}}, status=e.status)

  def _require_admin(self, request: web.Request) -> None:
    status = admin_status(request.headers, self.admin_token)
    if status is not None:
      raise EngineError(f"{request.path} needs the admin token (Authorization: Bearer TOKEN)", status=status)

  async def _json(self, request: web.Request) -> dict[str, Any]:
    try:
      body = await request.json()
    except ValueError as e:
      raise BadRequest(f"request body is not JSON: {e}") from None
    if not isinstance(body, dict):
      raise BadRequest("request body must be a JSON object")
    return body

  async def generate(self, request: web.Request) -> web.StreamResponse:
    body = await self._json(request)
    if "input_ids" not in body:
      raise BadRequest("input_ids: required (text prompts are not supported)")
    ids = body["input_ids"]
    batched = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
    stream = _field(body, "stream", (bool,), False, "request")
    if stream and batched:
      raise BadRequest("stream: only one prompt per streamed request")
    prompts = [_token_list(p, f"input_ids.{i}") for i, p in enumerate(ids)] if batched else [
        _token_list(ids, "input_ids")]
    sampling = parse_sampling(body, self.eos_token_id)
    logprobs = bool(body.get("return_logprob"))
    try:
      routes = RoutesRequest(body)
    except ValueError as e:
      raise BadRequest(str(e)) from None
    async with self.update_lock.request():  # held while a weight update waits or runs
      if stream:
        return await self._stream(request, prompts[0], sampling, logprobs, routes)
      results = await asyncio.gather(*(self.engine.generate(p, sampling) for p in prompts))
    outs = [self._response(r, sampling, logprobs, routes=routes) for r in results]
    return web.json_response(outs if batched else outs[0])

  async def _stream(self, request: web.Request, prompt: list[int], sampling: SamplingParams,
                    logprobs: bool, routes: RoutesRequest) -> web.StreamResponse:
    """SGLang's event stream as with `--incremental-streaming-output`: one event per sampled token, the
    last one also carrying the finish reason, the weight version and the whole text; an aborted
    request's tokens all go out, then SGLang's abort event."""
    loop = asyncio.get_running_loop()
    sampled: asyncio.Queue = asyncio.Queue()  # (id, logprob) per token, then None: all in order.

    def put_run(ids: tuple[int, ...], logprobs: tuple[float, ...]) -> None:
      for item in zip(ids, logprobs):
        sampled.put_nowait(item)

    done = self.engine.submit(prompt, sampling,
                              lambda ids, logprobs: loop.call_soon_threadsafe(put_run, ids, logprobs))
    done.add_done_callback(lambda _: loop.call_soon_threadsafe(sampled.put_nowait, None))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    request_id, n, held = f"clawjax-{next(self._ids)}", 0, None
    # Each token's event goes out when the next token comes: the last one is the finishing event.
    while (item := await sampled.get()) is not None:
      if held is not None:
        await response.write(_event(held))
      n += 1
      meta = {"id": request_id, "finish_reason": None, "prompt_tokens": len(prompt),
              "completion_tokens": n, **({"output_token_logprobs": [[item[1], item[0], None]]}
                                         if logprobs else {})}
      held = {"text": "", "output_ids": [item[0]], "meta_info": meta}
    try:
      result = done.result()
    except EngineError as e:
      last = {"error": {"message": str(e), "code": e.status}}
    else:
      last = self._response(result, sampling, logprobs, request_id, routes)
      if result.finish_reason == "abort":
        last = _abort_event(last)
      else:  # The finishing event carries the last token (a request that finishes sampled one).
        last["output_ids"] = held["output_ids"]
        if logprobs:
          last["meta_info"]["output_token_logprobs"] = held["meta_info"]["output_token_logprobs"]
        held = None
    if held is not None:
      await response.write(_event(held))
    await response.write(_event(last) + b"data: [DONE]\n\n")
    return response

  def _response(self, r: Result, sampling: SamplingParams, logprobs: bool,
                request_id: str | None = None, routes: RoutesRequest | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": request_id or f"clawjax-{next(self._ids)}",
        "finish_reason": _finish_reason(r, sampling.max_new_tokens),
        "prompt_tokens": r.prompt_tokens, "completion_tokens": len(r.output_ids),
        "cached_tokens": r.cached_tokens, "weight_version": self._reported[r.policy_version]}
    if logprobs:
      meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(r.output_logprobs, r.output_ids)]
    if routes is not None and routes.wanted and r.routed_experts is not None:  # (an engine recording them)
      meta["routed_experts"] = sglang_routed_experts(r.routed_experts, routes.start, self.engine.runner.model_config)
    text = self.decode(list(r.output_ids)) if self.decode else ""
    return {"text": text, "output_ids": list(r.output_ids), "meta_info": meta}

  async def health(self, request: web.Request) -> web.Response:
    return web.Response(text="")

  def _idle(self) -> bool:
    stats = self.engine.stats()
    return stats["queued"] == 0 and stats["running"] == 0

  async def flush_cache(self, request: web.Request) -> web.Response:
    """SGLang's flush: only of an idle engine; `?timeout=S` waits up to S seconds for idle."""
    self._require_admin(request)
    try:
      timeout = float(request.query.get("timeout", 0.0))
    except ValueError:
      timeout = -1.0
    if not timeout >= 0:
      raise BadRequest(f"timeout: {request.query['timeout']!r} is not a number >= 0", status=422)
    if self._flush_waiting:
      return web.Response(text=FLUSH_BUSY, status=400)
    deadline = time.monotonic() + timeout
    self._flush_waiting = timeout > 0
    try:
      while not self._idle():
        if timeout <= 0:
          return web.Response(text=FLUSH_FAILED, status=400)
        if time.monotonic() >= deadline:
          return web.Response(text=FLUSH_TIMED_OUT, status=400)
        await asyncio.sleep(IDLE_POLL_S)
    finally:
      self._flush_waiting = False
    self.engine.flush_cache()
    return web.Response(text=FLUSHED)

  async def update_weights_from_disk(self, request: web.Request) -> web.Response:
    self._require_admin(request)
    body = await self._json(request)
    path = body.get("model_path")
    if not isinstance(path, str) or not path:
      raise BadRequest("model_path: required, a directory of HF safetensors", status=422)
    wanted = body.get("weight_version")
    if wanted is not None and not isinstance(wanted, str):  # SGLang's field is Optional[str]
      raise BadRequest(f"weight_version: {wanted!r} is not a string", status=422)
    abort = _field(body, "abort_all_requests", (bool,), False, "request")
    start = time.monotonic()
    if abort:
      self.engine.abort_all()
    in_flight = self.update_lock.in_flight
    async with self.update_lock.update():
      drained_s = time.monotonic() - start
      count = self.engine.version + 1
      # Known before the engine takes the weights: results of requests admitted on them name it.
      self._reported[count] = self._reported[self.engine.version] if wanted is None else wanted
      try:
        # The engine clears its prefix cache with the new weights (SGLang's flush inside the update).
        await asyncio.to_thread(self.reload, path, count)
      except (OSError, ValueError, KeyError, EngineError) as e:
        del self._reported[count]
        return web.json_response({"success": False, "message": f"{path}: {e}", "num_paused_requests": 0},
                                 status=400)
      self.model_path = path
      held = self.update_lock.held
    log.info("weight update to %r: %d requests in flight %s in %.2f s, %d held; loaded in %.2f s",
             self._reported[count], in_flight, "aborted" if abort else "drained", drained_s, held,
             time.monotonic() - start - drained_s)
    message = "Succeeded to update model weights." + (
        f" Weight version updated to {wanted}." if wanted is not None else "")
    return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

  async def model_info(self, request: web.Request) -> web.Response:
    return web.json_response({"model_path": self.model_path, "tokenizer_path": self.model_path,
                              "is_generation": True, "weight_version": self._reported[self.engine.version]})

  async def models(self, request: web.Request) -> web.Response:
    """SGLang's OpenAI-style model list (one model, served as its path): a router in front (SGLang's
    model gateway) finds the worker's backend and model by it."""
    return web.json_response({"object": "list", "data": [{"id": self.model_path, "object": "model",
                                                          "owned_by": "sglang", "root": self.model_path}]})

  async def get_model_info(self, request: web.Request) -> web.Response:
    log.warning("Endpoint '/get_model_info' is deprecated; use '/model_info' (as in SGLang 0.5.23)")
    return await self.model_info(request)


def _abort_event(last: dict[str, Any]) -> dict[str, Any]:
  """SGLang's event for a request it aborts outside the output stream (tokenizer_manager.py,
  `_handle_abort_req`): the whole text, output_ids [the last token] under incremental streaming, the
  log-probs of every token, completion_tokens the count; no prompt or cache counts."""
  meta = last["meta_info"]
  return {"text": last["text"], "output_ids": last["output_ids"][-1:], "meta_info": {
      "id": meta["id"], "finish_reason": meta["finish_reason"], "weight_version": meta["weight_version"],
      "completion_tokens": meta["completion_tokens"],
      **({"output_token_logprobs": meta["output_token_logprobs"]} if "output_token_logprobs" in meta else {})}}
