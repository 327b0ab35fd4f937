"""`sglang`: SGLang's native API (also spoken by `python -m clawjax.engine`). Checked against SGLang
0.5.23's source: docs/engine.md has the table of every endpoint and field, and where SGLang defines it.

POST /generate {input_ids, sampling_params, return_logprob: true} -> {output_ids, meta_info:
{output_token_logprobs: [[logprob, token_id, null], ...], finish_reason: {type: "stop"|"length"|
"abort", ...}, completion_tokens, weight_version, ...}}; GET /health; POST /update_weights_from_disk
{model_path, weight_version, abort_all_requests, flush_cache} (with the admin key: `admin_api_key`, see
http.py), then GET /model_info (/get_model_info on a server without it) for the version.

The update is SGLang's whole push: it holds new requests and waits for those in flight (or aborts them:
`abort=True`), flushes the prefix cache while nothing runs, then lets the held requests go. A
/flush_cache of its own after it would meet them running and be refused (400), so there is none.

Streaming (`generate_streaming`): the same request plus `stream: true` answers `text/event-stream`, one
event `data: {chunk}` per scheduler step with new tokens and `data: [DONE]` at the end. A chunk has the
answer's shape, with finish_reason null until the last one and completion_tokens the count sampled so
far. By default a chunk's output_ids and output_token_logprobs hold every token so far (cumulative), so
a long turn costs quadratic bytes and parsing; an SGLang server started with
`--incremental-streaming-output` sends only the new tokens, which is much cheaper at 8K-token turns. The
client cannot ask for either, so each chunk tells: it is cumulative when it holds completion_tokens
tokens (the first chunk reads the same both ways), else it holds the new ones. An error after the stream
began comes as a chunk {"error": {"message": ...}}. An aborted request (a weight update's
`abort_all_requests`, a client gone, a time limit) is recognised before its tokens are read, in a stream
and in a plain answer, and is retryable (503): with --incremental-streaming-output SGLang's abort chunk
carries output_ids [the last token] beside the log-probs of all of them.

Routes (`--backend-arg routed_experts=TOP_K`, the server started with `--enable-return-routed-experts`):
the request adds `return_routed_experts: true` and `routed_experts_start_len` (PromptIds.routes_from),
and the answer's (or last chunk's) meta_info.routed_experts is decoded by routes.py.

Log-probs: SGLang returns them after temperature scaling by default, which is the shim's convention
(do not set SGLANG_RETURN_ORIGINAL_LOGPROB on the engine). top_p/top_k are left at 1/-1 by the shim's
defaults so the returned log-probs are those of the distribution sampled from. `sampling_seed` is
honoured only by a server started with `--enable-deterministic-inference` (SGLang ignores it otherwise).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from clawjax.generation import FINISH_REASONS, Generation, SamplingParams, TokenSink
from clawjax.serving.backends.base import (BackendError, PromptIds, StreamedTokens, engine_generation,
                                           register_backend)
from clawjax.serving.backends.http import HttpBackend, json_with_ids
from clawjax.serving.backends.routes import sglang_routes


def _request_body(prompt: PromptIds, params: SamplingParams, **options: Any) -> bytes:
  sampling = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
              "top_p": params.top_p, "top_k": params.top_k,
              "stop_token_ids": list(params.stop_token_ids), "skip_special_tokens": False,
              "no_stop_trim": True}
  if params.seed is not None:
    sampling["sampling_seed"] = params.seed
  return json_with_ids("input_ids", prompt.json(),
                       {"sampling_params": sampling, "return_logprob": True, **options})


def _meta_info(answer: Any) -> dict[str, Any]:
  """The meta_info of a /generate answer or stream chunk; an error object is a BackendError naming it."""
  if isinstance(answer, dict) and isinstance(answer.get("meta_info"), dict):
    return answer["meta_info"]
  error = answer.get("error") if isinstance(answer, dict) else None
  if error is not None:
    message = error.get("message", error) if isinstance(error, dict) else error
    raise BackendError(f"sglang /generate: engine error: {message}")
  raise BackendError(f"sglang /generate: unexpected answer {str(answer)[:300]}")


def _tokens(answer: dict[str, Any], meta: dict[str, Any]) -> tuple[list[Any], list[Any]]:
  """The ids and log-probs in an answer's output_token_logprobs, checked against its output_ids.

  Values stay as sent when they are not numbers (orjson, which SGLang answers with, writes NaN as null),
  so that Generation's checks name them."""
  pairs = meta.get("output_token_logprobs")
  if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) >= 2 for p in pairs):
    raise BackendError("sglang /generate: meta_info.output_token_logprobs missing or malformed "
                       "(return_logprob?)")
  ids = [p[1] for p in pairs]
  logprobs = [float(p[0]) if isinstance(p[0], (int, float)) else p[0] for p in pairs]
  if "output_ids" in answer and list(answer["output_ids"]) != ids:
    raise BackendError("sglang /generate: output_ids disagree with output_token_logprobs ids")
  return ids, logprobs


def _weight_version(meta: dict[str, Any]) -> int | None:
  """The integer policy version of an answer: SGLang's weight_version is a string that clawjax sets to
  the trainer's step with every weight update ("default" before the first one, which is no version)."""
  version = meta.get("weight_version", meta.get("policy_version"))
  if isinstance(version, bool):
    return None
  if isinstance(version, int):
    return version
  return int(version) if isinstance(version, str) and version.isdecimal() else None


def _finish_kind(meta: dict[str, Any]) -> Any:
  finish = meta.get("finish_reason")
  return finish.get("type") if isinstance(finish, dict) else finish


def _check_not_aborted(meta: dict[str, Any]) -> None:
  """An aborted answer or stream chunk is a BackendError, before anything else in it is read: its tokens
  need not agree (SGLang's abort event under --incremental-streaming-output carries output_ids [the last
  token] beside the log-probs of all of them). Retryable (503): SGLang aborts what runs when a weight
  update asks (`abort_all_requests`), a client disconnects or a time limit passes; the harness asks
  again. Not retryable: an abort SGLang gives a 4xx status (a request it refuses, e.g. too long)."""
  if _finish_kind(meta) != "abort":
    return
  finish = meta["finish_reason"]
  message = finish.get("message") if isinstance(finish, dict) else None
  status = finish.get("status_code") if isinstance(finish, dict) else None
  if isinstance(status, int) and 400 <= status < 500 and status != 429:
    raise BackendError(f"sglang refused the request (HTTP {status}): {message}")
  raise BackendError(f"sglang aborted the request: {message}", status=503)


def _generation(ids: list[Any], logprobs: list[Any], meta: dict[str, Any]) -> Generation:
  """The Generation of a finished answer (not an aborted one); a bad answer is a BackendError."""
  kind = _finish_kind(meta)
  if kind not in FINISH_REASONS:
    raise BackendError(f"sglang /generate: unknown finish_reason {meta.get('finish_reason')!r}")
  cached = meta.get("cached_tokens")
  return engine_generation("sglang /generate", ids, logprobs, kind, _weight_version(meta),
                           cached if isinstance(cached, int) and not isinstance(cached, bool) else None)


class SGLangBackend(HttpBackend):
  _info_path = "/model_info"  # until a server answers it 404

  def _route_options(self, prompt: PromptIds) -> dict[str, Any]:
    """The request fields that ask for the call's routes past `prompt.routes_from` (none when not asked)."""
    if not self.routes_top_k:
      return {}
    return {"return_routed_experts": True, "routed_experts_start_len": prompt.routes_from}

  def _with_routes(self, gen: Generation, meta: dict[str, Any], prompt: PromptIds) -> Generation:
    if not self.routes_top_k:
      return gen
    routes = sglang_routes(meta, prompt.routes_from, len(prompt.ids) + len(gen.output_ids) - 1, self.routes_top_k)
    return dataclasses.replace(gen, routed_experts=routes)

  async def generate(self, prompt: PromptIds, params: SamplingParams) -> Generation:
    answer = await self.request("POST", "/generate", body=_request_body(prompt, params, **self._route_options(prompt)),
                                routing_key=prompt.routing_key)
    meta = _meta_info(answer)
    _check_not_aborted(meta)
    ids, logprobs = _tokens(answer, meta)
    return self._with_routes(_generation(ids, logprobs, meta), meta, prompt)

  async def generate_streaming(self, prompt: PromptIds, params: SamplingParams,
                               on_tokens: TokenSink) -> Generation:
    got, meta = StreamedTokens("sglang /generate", on_tokens), None
    body = _request_body(prompt, params, stream=True, **self._route_options(prompt))
    async with contextlib.aclosing(self.stream("POST", "/generate", body=body,
                                               routing_key=prompt.routing_key)) as chunks:
      async for chunk in chunks:
        if meta is not None and meta.get("finish_reason") is not None:
          raise BackendError("sglang /generate: stream went on after its finishing chunk")
        meta = _meta_info(chunk)
        _check_not_aborted(meta)
        ids, logprobs = _tokens(chunk, meta)
        total = meta.get("completion_tokens")
        if not isinstance(total, int):
          # Without the count a cumulative chunk cannot be told from new tokens.
          raise BackendError(f"sglang /generate: stream chunk without completion_tokens: {total!r}")
        if len(ids) == total:  # Cumulative: what came before must be its prefix.
          have = got.ids
          if ids[:len(have)] != have:
            diverge = next((i for i, (a, b) in enumerate(zip(have, ids)) if a != b),
                           min(len(have), len(ids)))
            raise BackendError(
                f"sglang /generate: cumulative stream chunk of {len(ids)} tokens disagrees with "
                f"the {len(have)} already received at output_ids[{diverge}]")
          ids, logprobs = ids[len(have):], logprobs[len(have):]
        got.add(ids, logprobs)
    if meta is None or meta.get("finish_reason") is None:
      raise got.unfinished()
    return self._with_routes(_generation(got.ids, got.logprobs, meta), meta, prompt)

  async def update_weights_from_disk(self, model_path: str, version: int, abort: bool = False) -> int | None:
    # SGLang's update flushes the prefix cache itself (`flush_cache`, true by default), while it holds
    # new requests and none runs; a /flush_cache after it would meet the held requests running again
    # and be refused (400).
    body = await self.request("POST", "/update_weights_from_disk",
                              {"model_path": model_path, "weight_version": str(version),
                               "abort_all_requests": abort, "flush_cache": True}, admin=True)
    if isinstance(body, dict) and body.get("success") is False:
      raise BackendError(f"sglang weight update failed: {body.get('message')}")
    # SGLang's answer to the update carries no version; its model info does.
    info = await self.model_info()
    return _weight_version(info) if isinstance(info, dict) else None

  async def model_info(self) -> Any:
    """GET /model_info, or /get_model_info from a server without it (SGLang before /model_info; 0.5.23
    still answers the old name, with a deprecation warning in its log per call)."""
    if self._info_path == "/model_info":
      try:
        return await self.request("GET", "/model_info")
      except BackendError as e:
        if e.http_status != 404:
          raise
      self._info_path = "/get_model_info"
    return await self.request("GET", self._info_path)


@register_backend("sglang")
def make_sglang(url: str | None, model: str | None = None, **options: Any) -> SGLangBackend:
  del model  # The engine serves its own weights; the shim needs only the template (from --model).
  return SGLangBackend(url, **options)
