"""`vllm`: vLLM's OpenAI-compatible /v1/completions with a token-id prompt.

POST /v1/completions {model, prompt: [ids], max_tokens, temperature, top_p, top_k, stop_token_ids,
logprobs: 0, return_token_ids: true, skip_special_tokens: false} -> choices[0].token_ids,
choices[0].logprobs.token_logprobs, choices[0].finish_reason.

Log-probs: start vLLM with `--logprobs-mode processed_logprobs` so they are taken after temperature
scaling (the shim's convention; vLLM's default is the raw, temperature-1 distribution), and keep the
shim's top_p=1/top_k=-1 so no truncation enters them.
"""

from __future__ import annotations

from typing import Any

from clawjax.serving.backends.base import (BackendError, Generation, SamplingParams,
                                           ids_json_text, register_backend)
from clawjax.serving.backends.http import HttpBackend, json_with_ids


class VLLMBackend(HttpBackend):
  health_path = "/health"

  def __init__(self, url: str | None, served_model: str | None = None, **options: Any):
    super().__init__(url, **options)
    self.served_model = served_model

  async def _model(self) -> str:
    if self.served_model is None:
      body = await self.request("GET", "/v1/models")
      try:
        self.served_model = body["data"][0]["id"]
      except (KeyError, IndexError, TypeError):
        raise BackendError(f"vllm /v1/models: no model listed in {str(body)[:300]}") from None
    return self.served_model

  async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
    payload = {"model": await self._model(), "max_tokens": params.max_new_tokens,
               "temperature": params.temperature,
               "top_p": params.top_p, "top_k": params.top_k,
               "stop_token_ids": list(params.stop_token_ids), "logprobs": 0,
               "return_token_ids": True, "skip_special_tokens": False,
               "include_stop_str_in_output": True}
    if params.seed is not None:
      payload["seed"] = params.seed
    body = await self.request("POST", "/v1/completions",
                              body=json_with_ids("prompt", ids_json_text(input_ids), payload))
    try:
      choice = body["choices"][0]
      ids = [int(t) for t in choice["token_ids"]]
      logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
      finish = choice["finish_reason"]
    except (KeyError, IndexError, TypeError, ValueError):
      raise BackendError(f"vllm /v1/completions: unexpected answer {str(body)[:300]}") from None
    if finish not in ("stop", "length"):
      raise BackendError(f"vllm /v1/completions: finish_reason {finish!r}", status=503)
    try:
      return Generation(tuple(ids), tuple(logprobs), finish, None)
    except ValueError as e:
      raise BackendError(f"vllm /v1/completions: {e}") from None


@register_backend("vllm")
def make_vllm(url: str | None, model: str | None = None, **options: Any) -> VLLMBackend:
  del model  # --model picks the chat template; the served name is asked from /v1/models.
  return VLLMBackend(url, **options)
