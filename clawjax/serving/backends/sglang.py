"""`sglang`: SGLang's native API (also spoken by `python -m clawjax.engine`).

POST /generate {input_ids, sampling_params, return_logprob: true} -> {output_ids, meta_info:
{output_token_logprobs: [[logprob, token_id, null], ...], finish_reason: {type: "stop"|"length"|
"abort", ...}, ...}}; GET /health; POST /update_weights_from_disk {model_path}; POST /flush_cache.

Log-probs: SGLang returns them after temperature scaling by default, which is the shim's convention
(do not set SGLANG_RETURN_ORIGINAL_LOGPROB on the engine). top_p/top_k are left at 1/-1 by the shim's
defaults so the returned log-probs are those of the distribution sampled from.
"""

from __future__ import annotations

from typing import Any

from clawjax.serving.backends.base import (BackendError, Generation, SamplingParams,
                                           ids_json_text, register_backend)
from clawjax.serving.backends.http import HttpBackend, json_with_ids

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def parse_generate_response(body: Any) -> tuple[list[int], list[float], str, int | None]:
  """(output ids, log-probs, finish reason, weight version) of a /generate answer."""
  if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
    raise BackendError(f"sglang /generate: unexpected answer {str(body)[:300]}")
  meta = body["meta_info"]
  pairs = meta.get("output_token_logprobs")
  if not isinstance(pairs, list):
    raise BackendError("sglang /generate: meta_info.output_token_logprobs missing (return_logprob?)")
  ids = [int(p[1]) for p in pairs]
  logprobs = [float(p[0]) for p in pairs]
  if "output_ids" in body and list(body["output_ids"]) != ids:
    raise BackendError("sglang /generate: output_ids disagree with output_token_logprobs ids")
  finish = meta.get("finish_reason")
  kind = finish.get("type") if isinstance(finish, dict) else finish
  if kind not in _FINISH:
    raise BackendError(f"sglang /generate: unknown finish_reason {finish!r}")
  version = meta.get("weight_version", meta.get("policy_version"))
  try:
    version = None if version is None else int(version)
  except (TypeError, ValueError):
    version = None  # SGLang's weight_version is a free-form string; only integers are versions here.
  return ids, logprobs, _FINISH[kind], version


class SGLangBackend(HttpBackend):

  async def generate(self, input_ids: list[int], params: SamplingParams) -> Generation:
    sampling = {"max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "top_k": params.top_k,
                "stop_token_ids": list(params.stop_token_ids), "skip_special_tokens": False,
                "no_stop_trim": True}
    if params.seed is not None:
      sampling["sampling_seed"] = params.seed
    body = await self.request("POST", "/generate", body=json_with_ids(
        "input_ids", ids_json_text(input_ids),
        {"sampling_params": sampling, "return_logprob": True}))
    ids, logprobs, finish, version = parse_generate_response(body)
    if finish == "abort":
      raise BackendError(f"sglang aborted the request: {body['meta_info'].get('finish_reason')}",
                         status=503)
    try:
      return Generation(tuple(ids), tuple(logprobs), finish, version)
    except ValueError as e:
      raise BackendError(f"sglang /generate: {e}") from None

  async def update_weights_from_disk(self, model_path: str) -> int | None:
    body = await self.request("POST", "/update_weights_from_disk", {"model_path": model_path})
    if isinstance(body, dict) and body.get("success") is False:
      raise BackendError(f"sglang weight update failed: {body.get('message')}")
    version = body.get("weight_version", body.get("policy_version")) if isinstance(body, dict) else None
    return int(version) if isinstance(version, int) else None

  async def flush_cache(self) -> None:
    await self.request("POST", "/flush_cache")


@register_backend("sglang")
def make_sglang(url: str | None, model: str | None = None, **options: Any) -> SGLangBackend:
  del model  # The engine serves its own weights; the shim needs only the template (from --model).
  return SGLangBackend(url, **options)
