"""`vllm`: vLLM's OpenAI-compatible /v1/completions with a token-id prompt.

POST /v1/completions {model, prompt: [ids], max_tokens, temperature, top_p, top_k, stop_token_ids,
logprobs: 0, return_token_ids: true, skip_special_tokens: false} -> choices[0].token_ids,
choices[0].logprobs.token_logprobs, choices[0].finish_reason. With `stream: true`
(`generate_streaming`) the answer is an event stream of chunks of the same shape holding the new
tokens only, finish_reason null until the last, a usage chunk (asked for, to check the count), then
`data: [DONE]`; an error after the stream began comes as an event without `choices`
({"object": "error", "message": ...} or {"error": {...}}).

Routes (`--backend-arg routed_experts=TOP_K`, vLLM started with `--enable-return-routed-experts`): the
request adds `routed_experts_prompt_start` (PromptIds.routes_from); a whole answer's
choices[0].routed_experts is decoded by routes.py. vLLM (0.32) puts none on stream chunks, so a streamed
call (the shim's --incremental-stream) is logged without routes.

Log-probs: start vLLM with `--logprobs-mode processed_logprobs` so they are taken after temperature
scaling (the shim's convention; vLLM's default is the raw, temperature-1 distribution), and keep the
shim's top_p=1/top_k=-1 so no truncation enters them.
"""

from __future__ import annotations

import contextlib
from typing import Any

from clawjax.generation import Generation, SamplingParams, TokenSink
from clawjax.routes import RoutedExperts
from clawjax.serving.backends.base import (BackendError, PromptIds, StreamedTokens, engine_generation,
                                           register_backend)
from clawjax.serving.backends.http import HttpBackend, json_with_ids
from clawjax.serving.backends.routes import vllm_routes


class VLLMBackend(HttpBackend):
  health_path = "/health"

  def __init__(self, url: str | None, served_model: str | None = None, **options: Any):
    super().__init__(url, **options)
    self.served_model = served_model

  async def _model(self) -> str:
    if self.served_model is None:
      served = (await self.served_model_card()).get("id")
      if not isinstance(served, str):
        raise BackendError(f"vllm /v1/models: the model has no id: {str(served)[:300]}")
      self.served_model = served
    return self.served_model

  async def _request_body(self, prompt: PromptIds, params: SamplingParams, **options: Any) -> bytes:
    if self.routes_top_k:
      options["routed_experts_prompt_start"] = prompt.routes_from
    payload = {"model": await self._model(), "max_tokens": params.max_new_tokens,
               "temperature": params.temperature,
               "top_p": params.top_p, "top_k": params.top_k,
               "stop_token_ids": list(params.stop_token_ids), "logprobs": 0,
               "return_token_ids": True, "skip_special_tokens": False,
               "include_stop_str_in_output": True, **options}
    if params.seed is not None:
      payload["seed"] = params.seed
    return json_with_ids("prompt", prompt.json(), payload)

  async def generate(self, prompt: PromptIds, params: SamplingParams) -> Generation:
    body = await self._request_body(prompt, params)
    answer = await self.request("POST", "/v1/completions", body=body, routing_key=prompt.routing_key)
    ids, logprobs, finish = _choice(answer)
    routes = None
    if self.routes_top_k:  # (_choice checked the answer's shape)
      routes = vllm_routes(answer["choices"][0], prompt.routes_from, len(prompt.ids) + len(ids) - 1)
    return _generation(ids, logprobs, finish, routes)

  async def generate_streaming(self, prompt: PromptIds, params: SamplingParams,
                               on_tokens: TokenSink) -> Generation:
    # The usage chunk's token count catches a chunk lost on the way (nothing else would).
    body = await self._request_body(prompt, params, stream=True,
                                    stream_options={"include_usage": True})
    got, finish, usage = StreamedTokens("vllm /v1/completions", on_tokens), None, None
    async with contextlib.aclosing(self.stream("POST", "/v1/completions", body=body,
                                               routing_key=prompt.routing_key)) as chunks:
      async for chunk in chunks:
        if isinstance(chunk, dict) and chunk.get("choices") == []:
          usage = chunk.get("usage")
          continue
        if finish is not None:
          raise BackendError("vllm /v1/completions: stream went on after its finishing chunk")
        ids, logprobs, finish = _choice(chunk)
        got.add(ids, logprobs)
    if finish is None:
      raise got.unfinished()
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if counted is not None and counted != len(got.ids):
      raise BackendError(f"vllm /v1/completions: usage counts {counted} tokens, the stream held "
                         f"{len(got.ids)}", status=503)
    return _generation(got.ids, got.logprobs, finish)


def _choice(answer: Any) -> tuple[list[Any], list[Any], str | None]:
  """(token ids, log-probs, finish reason) of an answer or stream chunk's first choice."""
  try:
    choice = answer["choices"][0]
    ids = list(choice["token_ids"] or [])
    logprobs = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
    finish = choice.get("finish_reason")
  except (KeyError, IndexError, TypeError) as e:
    error = answer.get("error", answer.get("message")) if isinstance(answer, dict) else None
    if error is not None:
      raise BackendError(f"vllm /v1/completions: engine error: {error}") from None
    raise BackendError(f"vllm /v1/completions: unexpected answer ({type(e).__name__}) "
                       f"{str(answer)[:300]}") from None
  if len(ids) != len(logprobs):
    raise BackendError(f"vllm /v1/completions: {len(ids)} token_ids but {len(logprobs)} "
                       "token_logprobs (logprobs: 0 asked)")
  return ids, logprobs, finish


def _generation(ids: list[Any], logprobs: list[Any], finish: str | None,
                routes: RoutedExperts | None = None) -> Generation:
  if finish not in ("stop", "length"):
    raise BackendError(f"vllm /v1/completions: finish_reason {finish!r}", status=503)
  return engine_generation("vllm /v1/completions", ids, logprobs, finish, routed_experts=routes)


@register_backend("vllm")
def make_vllm(url: str | None, model: str | None = None, **options: Any) -> VLLMBackend:
  del model  # --model picks the chat template; the served name is asked from /v1/models.
  return VLLMBackend(url, **options)
