"""The `embedded` backend: the in-process JAX engine (clawjax/engine/) behind the shim, no HTTP in between.

`create_backend("embedded", model="test-tiny" | "smollm2-135m" | HF_DIR)` builds its own engine; a
trainer in the same process passes `engine=` (an `Engine` it also updates with `update_params`) instead.
Log-probs follow base.py's convention exactly (clawjax/engine/sampling.py computes them), and every
Generation carries the policy version that sampled all of its tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from clawjax.config import parse_value
from clawjax.engine.engine import Engine, EngineConfig, EngineError
from clawjax.generation import Generation, SamplingParams, TokenSink
from clawjax.models.loading import load_model, load_weights
from clawjax.routes import RoutedExperts
from clawjax.serving.backends.base import BackendError, PromptIds, SamplingBackend, register_backend


class EmbeddedBackend(SamplingBackend):

  def __init__(self, engine: Engine, owns_engine: bool, model=None):
    """`model`: the Decoder the engine was built from, the template for weight reloads from disk."""
    self.engine, self._owns_engine, self._model = engine, owns_engine, model

  async def sample(self, prompt: PromptIds, params: SamplingParams,
                   on_tokens: TokenSink | None) -> Generation:
    try:
      r = await self.engine.generate(prompt.ids, params, on_tokens)
    except EngineError as e:
      raise BackendError(f"embedded engine: {e}", status=e.status) from e
    if r.finish_reason == "abort":  # cut short by a weight update: retryable, as sglang.py treats it
      raise BackendError("embedded engine: request aborted by a weight update", status=503)
    routes = None if r.routed_experts is None else RoutedExperts(0, r.routed_experts)
    return Generation(output_ids=r.output_ids, output_logprobs=r.output_logprobs,
                      finish_reason=r.finish_reason, policy_version=r.policy_version,
                      cached_tokens=r.cached_tokens, routed_experts=routes)

  async def health(self) -> bool:
    return self.engine.alive

  async def context_length(self) -> int | None:
    return self.engine.config.max_seq_len

  async def update_weights_from_disk(self, model_path: str, version: int, abort: bool = False) -> int | None:
    if self._model is None:
      raise BackendError("embedded: the engine was passed in; update it through its owner", status=501)
    try:
      model = await asyncio.to_thread(load_weights, model_path, self._model)
      if abort:  # (a request admitted while the weights are copied in is waited for)
        self.engine.abort_all()
      return await asyncio.to_thread(self.engine.update_from_model, model, version)
    except EngineError as e:
      raise BackendError(f"embedded: {e}", status=e.status) from e
    except (OSError, ValueError, KeyError) as e:
      raise BackendError(f"embedded: cannot load weights from {model_path}: {e}", status=500) from e

  async def close(self) -> None:
    if self._owns_engine:
      await asyncio.to_thread(self.engine.close)


def engine_config(options: dict[str, Any]) -> EngineConfig:
  """EngineConfig from factory options; strings (`--backend-arg max_slots=16`) take the field's type."""
  fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
  unknown = sorted(set(options) - set(fields))
  if unknown:
    raise ValueError(f"embedded backend: unknown options {unknown}; EngineConfig fields are {sorted(fields)}")
  values = {}
  for name, value in options.items():
    kind = type(fields[name].default)
    try:
      values[name] = parse_value(kind, value, name) if isinstance(value, str) else kind(value)
    except ValueError:
      raise ValueError(f"embedded backend: option {name}={value!r} is not a {kind.__name__}") from None
  return EngineConfig(**values)


@register_backend("embedded")
def create(model: str | None = None, url: str | None = None, engine: Engine | None = None,
           init_seed: int | str = 0, **options: Any) -> EmbeddedBackend:
  """options: EngineConfig fields (max_slots, max_seq_len, ...). `url` is ignored (no server)."""
  del url
  if engine is not None:
    return EmbeddedBackend(engine, owns_engine=False)
  if model is None:
    raise ValueError("embedded backend: pass model= (a preset or HF dir) or engine=")
  config = engine_config(options)
  loaded = load_model(model, seed=int(init_seed))
  return EmbeddedBackend(Engine(loaded.model, config), owns_engine=True, model=loaded.model)
