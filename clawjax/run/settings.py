"""The `config.model` and `config.engine` sections, the same in training and evaluation configs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from clawjax import config as config_lib
from clawjax.config import ConfigError
from clawjax.models.config import PRESETS, ModelConfig, unknown_model
from clawjax.harness.adapters import ADAPTERS, context_problem
from clawjax.serving.backends.base import backend_names


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  # A preset (clawjax.models.config.PRESETS: test-tiny, smollm2-135m, qwen3-...) or a Hugging Face
  # safetensors directory: the weights training starts from, or the model being evaluated.
  init: str | None = "test-tiny"
  # Random weights of the preset's architecture even where the preset has real ones (smollm2-135m).
  random_init: bool = False
  # ModelConfig fields to change: architecture sizes (random init only) or run-time fields
  # (dtype, param_dtype, attention_impl, remat).
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  template: str | None = None         # tokenizer + chat template source ("qwen3", a dir); None: `init`
  template_family: str | None = None  # "qwen3" | "chatml"; None: guessed from the model

  def __post_init__(self):
    config_lib.check_keys(ModelConfig, list(self.overrides), "config.model.overrides")

  def check_loadable(self) -> None:
    """For a run that loads `init` (training, SFT, an embedded engine): a ConfigError unless it names a
    preset or a Hugging Face directory, with the closest presets."""
    if not self.init:
      raise ConfigError("config.model.init: must be set (a preset or a model directory)")
    problem = unknown_model(self.init)
    if problem:
      raise ConfigError(f"config.model.init: {problem}")
    if self.random_init and self.init not in PRESETS:
      raise ConfigError(f"config.model.random_init: needs a preset, not the directory {self.init!r}")


PUSH_MODES = ("drain", "abort")


@dataclasses.dataclass(frozen=True)
class EngineSettings:
  # A clawjax.serving backend: "embedded" (the in-process JAX engine; training updates it in place),
  # "sglang", "vllm" (a running server at `url`), or "scripted" (a test policy; evaluation only).
  backend: str = "embedded"
  # sglang / vllm: the server root, or the root of SGLang's router in front of several servers
  # (`python -m sglang_router.launch_router --policy manual --worker-urls ...`; the shim's routing key
  # keeps each rollout on one server).
  url: str | None = None
  # The engine servers behind a router at `url`: each gets every weight update and must then report its
  # version. () = `url` is the one server.
  workers: tuple[str, ...] = ()
  # embedded: clawjax.engine.engine.EngineConfig fields; others: the backend factory's keyword arguments.
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  # Training with sglang / vllm: where new weights are exported (safetensors) for the engine to load;
  # the engine must see this path. None: WORKDIR/export.
  export_dir: str | None = None
  # What a weight push does to the model calls in flight (docs/training.md, "Weight pushes"):
  # "drain" (SGLang's default) holds new calls and waits for those in flight to finish on the old
  # weights, so the push takes as long as the longest turn in flight; "abort" ends them at once
  # (SGLang's `abort_all_requests`; the embedded engine's update_mode) and the harnesses retry them,
  # resampled from scratch on the new weights.
  push_mode: str = "drain"

  def __post_init__(self):
    if self.backend not in backend_names():
      raise ConfigError(f"config.engine.backend: {self.backend!r} is not one of {backend_names()}")
    if self.push_mode not in PUSH_MODES:
      raise ConfigError(f"config.engine.push_mode: {self.push_mode!r} is not one of {PUSH_MODES}")
    if self.backend == "embedded" and "update_mode" in self.options:
      raise ConfigError("config.engine.options.update_mode: set config.engine.push_mode instead")
    if self.workers and not self.url:
      raise ConfigError("config.engine.workers: needs engine.url, the router in front of them")
    if self.backend == "embedded":
      from clawjax.serving.backends import embedded  # pylint: disable=import-outside-toplevel  (the engine)
      config_lib.check_keys(embedded.EngineConfig, list(self.options), "config.engine.options")
      try:
        embedded.engine_config(self.options)
      except ValueError as e:
        raise ConfigError(f"config.engine.options: {e}") from None


def context_window(max_context: int, engine: EngineSettings) -> tuple[int, str]:
  """The most tokens a call may hold as far as the config tells (the shim's `max_context`, or the
  embedded engine's `max_seq_len` where smaller: the shim holds calls to the smaller), and the
  settings that say so. A remote engine's own limit is known only once it answers."""
  shim = f"shim.max_context={max_context}"
  if engine.backend != "embedded":
    return max_context, shim
  # pylint: disable-next=import-outside-toplevel  (JAX, for the engine's defaults: only where it runs here)
  from clawjax.serving.backends.embedded import engine_config
  try:
    seq = engine_config(engine.options).max_seq_len
  except ValueError:  # the engine names what is wrong with its options when it starts
    return max_context, shim
  return min(seq, max_context), f"the smaller of {shim} and engine.options.max_seq_len={seq}"


def harness_context_problem(harnesses: Sequence[str], max_context: int, engine: EngineSettings) -> str | None:
  """Why a harness of `harnesses` cannot work in the context the config allows (`context_window`), or
  None; also None for a name that is no harness (its own check says so)."""
  if not set(harnesses) <= set(ADAPTERS):
    return None
  return context_problem(harnesses, *context_window(max_context, engine))
