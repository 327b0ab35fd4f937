"""The backend interface: what the shim needs from an inference engine, and the registry of engines.

A backend turns prompt token ids into sampled token ids plus their log-probs; it never sees text. Every
backend (sglang, vllm, scripted, the in-process JAX engine `embedded`) implements `Backend`:

  async generate(PromptIds, SamplingParams) -> Generation
  async health() -> bool
  async close()
  optional: async generate_streaming(PromptIds, SamplingParams, on_tokens) -> Generation (the shim's
    --incremental-stream; a `SamplingBackend` has one `sample(..., on_tokens | None)` for both),
    async update_weights_from_disk(model_path, version, abort) -> int | None

`SamplingParams`, `Generation` (and its log-prob convention) and `TokenSink` are `clawjax.generation`'s,
shared with the rollout engine.

Failures raise `BackendError` with an HTTP-like status: 503/529 for overloaded or unavailable (the
harness retries), 500 for anything else. The shim turns it into the API's own error shape.

Registry: `create_backend("name", **kwargs)` imports the backend's module lazily (so `--backend scripted`
never imports JAX). A backend module registers itself with `@register_backend("name")`; built-in names
map to modules in `_BUILTIN_MODULES`. The CLI (`python -m clawjax.serving`) always passes
`url=` (str | None, from --backend-url) and `model=` (str, --model PATH_OR_PRESET); a factory takes the
keyword arguments it needs and must accept (and may ignore) those two.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from clawjax.calllog import MAX_TOKEN_ID, ids_json, is_token_id
from clawjax.generation import Generation, SamplingParams, TokenSink
from clawjax.routes import RoutedExperts


@dataclasses.dataclass(frozen=True)
class PromptIds:
  """The prompt of one generation: its token ids and, when the caller has it already, their JSON array
  text. The shim's call log encodes every prompt incrementally, so it passes that text and a remote
  backend sends it instead of re-encoding ~20K ids; anyone else gives the ids alone. `routing_key`: the
  rollout it belongs to, which a remote backend sends as SGLang's router routing key
  (`x-smg-routing-key`, its `--policy manual`), so that every call of a rollout reaches the replica that
  holds its prefix. `routes_from`: the routes of positions before it are in the log already, so an
  engine that can skip them (SGLang's routed_experts_start_len, vLLM's routed_experts_prompt_start) is
  asked for the later ones only."""
  ids: Sequence[int]
  json_text: bytes | None = None
  routing_key: str | None = None
  routes_from: int = 0

  def json(self) -> bytes:
    """The JSON array of `ids`: the cached text when there is one."""
    return self.json_text if self.json_text is not None else ids_json(self.ids)


class StreamedTokens:
  """What a streaming backend received so far. `add` checks the new ids before `on_tokens` sees them
  (log-probs wait for Generation's check at the end); `where` names the endpoint in errors."""

  def __init__(self, where: str, on_tokens: TokenSink):
    self.where, self.on_tokens = where, on_tokens
    self.ids: list[Any] = []
    self.logprobs: list[Any] = []

  def add(self, ids: list[Any], logprobs: list[Any]) -> None:
    bad = next((i for i, t in enumerate(ids) if not is_token_id(t)), None)
    if bad is not None:
      raise BackendError(f"{self.where}: output_ids[{len(self.ids) + bad}] is {ids[bad]!r}, not a "
                         f"token id in [0, {MAX_TOKEN_ID}]")
    self.ids += ids
    self.logprobs += logprobs
    if ids:
      self.on_tokens(ids)

  def unfinished(self) -> BackendError:
    """The error of a stream that ended before its finishing chunk (retryable: the connection went)."""
    return BackendError(f"{self.where}: stream ended after {len(self.ids)} tokens without finishing",
                        status=503)


class BackendError(Exception):
  """A failed generation. `status`: 503 or 529 = overloaded/unavailable (retryable), 500 = other.
  `http_status`: the remote engine's own HTTP status, where it answered with one."""

  def __init__(self, message: str, status: int = 500, http_status: int | None = None):
    super().__init__(message)
    self.status = status
    self.http_status = http_status

  @property
  def overloaded(self) -> bool:
    return self.status in (429, 503, 529)


def engine_generation(where: str, ids: Sequence[Any], logprobs: Sequence[Any], finish_reason: str,
                      policy_version: int | None = None, cached_tokens: int | None = None,
                      routed_experts: RoutedExperts | None = None) -> Generation:
  """The Generation of a remote engine's answer; one that is not valid (unpaired ids and log-probs, a
  bad id or log-prob) is a BackendError naming `where`."""
  try:
    return Generation(tuple(ids), tuple(logprobs), finish_reason, policy_version, cached_tokens, routed_experts)
  except ValueError as e:
    raise BackendError(f"{where}: {e}") from None


class Backend(abc.ABC):
  """An inference engine. Implementations must be safe for many concurrent `generate` calls."""

  @abc.abstractmethod
  async def generate(self, prompt: PromptIds, params: SamplingParams) -> Generation:
    """Samples a continuation of `prompt`; raises BackendError on failure."""

  async def generate_streaming(self, prompt: PromptIds, params: SamplingParams,
                               on_tokens: TokenSink) -> Generation:
    """`generate`, also calling `on_tokens(new_ids)` as the engine samples them (the shim streams the
    turn's text while it is generated). What `on_tokens` got, joined, must equal the returned
    `output_ids`; the shim checks. A backend that cannot stream inherits this: no calls, and the shim
    sends the whole turn at the end."""
    del on_tokens
    return await self.generate(prompt, params)

  async def health(self) -> bool:
    return True

  async def context_length(self) -> int | None:
    """The engine's own limit on prompt + generated tokens, where it tells one (None: unknown). The
    shim holds prompts and generations to the smaller of this and its --max-context (and tells each
    rollout that window, for its harness), so an engine started with a shorter context answers with
    the API's "prompt is too long" instead of an engine error on every call."""
    return None

  async def close(self) -> None:
    pass

  async def update_weights_from_disk(self, model_path: str, version: int, abort: bool = False) -> int | None:
    """Reloads weights from an HF safetensors dir as policy `version` (the engine then reports it with
    every generation), leaving no prefix cached under the old weights; returns the version the engine
    reports now (None: it reports none). Requests in flight finish on the old weights first, new ones
    waiting (SGLang's update), or with `abort` end at once as aborted (the harness retries them)."""
    raise BackendError(f"{type(self).__name__} cannot update weights", status=501)


class SamplingBackend(Backend):
  """A backend with one way to sample, which can hand on its tokens or not: `generate` and
  `generate_streaming` are both `sample`."""

  @abc.abstractmethod
  async def sample(self, prompt: PromptIds, params: SamplingParams,
                   on_tokens: TokenSink | None) -> Generation:
    """`generate`, calling `on_tokens` (when given) as `generate_streaming` does."""

  async def generate(self, prompt: PromptIds, params: SamplingParams) -> Generation:
    return await self.sample(prompt, params, None)

  async def generate_streaming(self, prompt: PromptIds, params: SamplingParams,
                               on_tokens: TokenSink) -> Generation:
    return await self.sample(prompt, params, on_tokens)


BackendFactory = Callable[..., Backend]
_REGISTRY: dict[str, BackendFactory] = {}
_BUILTIN_MODULES = {
    "sglang": "clawjax.serving.backends.sglang",
    "vllm": "clawjax.serving.backends.vllm",
    "scripted": "clawjax.serving.backends.scripted",
    "embedded": "clawjax.serving.backends.embedded",
}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
  """Class/function decorator: makes `create_backend(name, **kwargs)` call the factory with kwargs."""

  def deco(factory: BackendFactory) -> BackendFactory:
    _REGISTRY[name] = factory
    return factory

  return deco


def backend_names() -> list[str]:
  return sorted(set(_REGISTRY) | set(_BUILTIN_MODULES))


def create_backend(name: str, **kwargs: Any) -> Backend:
  """Builds backend `name`; kwargs go to its factory (e.g. url=..., model=...)."""
  if name not in _REGISTRY and name in _BUILTIN_MODULES:
    importlib.import_module(_BUILTIN_MODULES[name])
  if name not in _REGISTRY:
    raise ValueError(f"unknown backend {name!r}; known: {backend_names()}")
  return _REGISTRY[name](**kwargs)
