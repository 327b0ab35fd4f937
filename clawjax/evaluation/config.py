"""The evaluation's typed configuration, built from an ml_collections ConfigDict (configs/eval/*.py).

The ConfigDict mirrors the dataclasses field by field: top-level `EvalConfig` fields, `engine`
(`EngineSettings`), `shim` (clawjax.serving.server.ShimConfig), `rollout`
(clawjax.harness.rollout.RolloutConfig, with its nested `harness`, `sandbox`, `scoring`, `judge`).
A section field left out keeps the dataclass default; an unknown or mistyped field is a `ConfigError`
naming its path (e.g. `config.rollout.harness.max_turns`). An optional component whose required fields
are unset (e.g. `rollout.judge` without `url` and `model`) is off.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from clawjax.evaluation.results import STATUSES
from clawjax.evaluation.summary import UNSCORED_CHOICES
from clawjax.harness.adapters import ADAPTERS
from clawjax.harness.rollout import RolloutConfig
from clawjax.serving.server import ShimConfig

T = TypeVar("T")
JUDGE_KEY_ENV = "CLAWJAX_JUDGE_KEY"  # the judge's API key comes from here, never from a config file


class ConfigError(ValueError):
  pass


@dataclasses.dataclass(frozen=True)
class EngineSettings:
  """The backend the shim is started with (unused when `EvalConfig.shim_url` is set)."""
  backend: str = "embedded"  # clawjax.serving.backends: sglang, vllm, embedded, scripted
  # Preset (test-tiny, smollm2-135m, qwen3-...) or HF model directory. The tokenizer and chat template
  # come from `template` when set, else from here.
  model: str | None = None
  template: str | None = None  # tokenizer/template source when it differs from `model` ("qwen3", a dir)
  template_family: str | None = None  # "qwen3" or "chatml"; None: guessed from the model
  url: str | None = None  # engine root URL (sglang, vllm)
  options: dict[str, Any] = dataclasses.field(default_factory=dict)  # backend factory keyword args


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  tasks: str  # a task directory, a directory of tasks, a JSONL file or a PinchBench tasks/ dir
  harness: str = "openclaw"  # adapter name: openclaw, claude_code, mini
  benchmark: str = "ClawGym-Bench"  # the Table 1 column this run fills
  model_label: str | None = None  # the Table 1 row name; None: the engine model's base name
  task_ids: tuple[str, ...] = ()  # evaluate only these tasks (`--config.task_ids=a,b`); () = all
  max_tasks: int = 0  # evaluate only the first N tasks in load order; 0 = all
  num_samples: int = 1  # rollouts per task; a task scores the mean over them
  concurrency: int = 8  # rollouts in flight at once
  rerun_statuses: tuple[str, ...] = ("failed",)  # a resumed run redoes rollouts last recorded so
  unscored: str = "zero"  # how a rollout with no score counts: see clawjax/evaluation/summary.py
  # Use a task's own wall clock (PinchBench `timeout_seconds`) for its rollout and harness where it
  # has one, instead of rollout.timeout_s.
  task_timeouts: bool = False
  progress: bool = True  # tqdm progress bar on stderr
  shim_url: str | None = None  # connect to a running shim instead of starting one
  engine: EngineSettings = EngineSettings()
  shim: ShimConfig = dataclasses.field(default_factory=lambda: ShimConfig(log_dir=""))
  rollout: RolloutConfig = RolloutConfig()

  def __post_init__(self):
    checks = [
        ("harness", self.harness in ADAPTERS, f"not one of {sorted(ADAPTERS)}"),
        ("num_samples", self.num_samples >= 1, "must be >= 1"),
        ("concurrency", self.concurrency >= 1, "must be >= 1"),
        ("max_tasks", self.max_tasks >= 0, "must be >= 0"),
        ("unscored", self.unscored in UNSCORED_CHOICES, f"not one of {UNSCORED_CHOICES}"),
        ("rerun_statuses", set(self.rerun_statuses) <= set(STATUSES), f"not a subset of {STATUSES}"),
        ("shim.log_dir", not self.shim.log_dir, "is set by the run (WORKDIR/calls); leave it out"),
        ("engine.model", self.shim_url or self.engine.model, "required unless shim_url is set"),
    ]
    for field, ok, message in checks:
      if not ok:
        raise ConfigError(f"config.{field}: {message}")

  @property
  def label(self) -> str:
    if self.model_label:
      return self.model_label
    return os.path.basename(os.path.normpath(self.engine.model)) if self.engine.model else "policy"


def _dataclass_in(hint: Any) -> type | None:
  candidates = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
  return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def _convert(hint: Any, value: Any, where: str, default: Any) -> Any:
  nested = _dataclass_in(hint)
  if nested is not None and isinstance(value, Mapping):
    if default is None:  # an optional component: off while its required fields are unset
      required = [f.name for f in dataclasses.fields(nested) if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING]
      unset = [k for k in required if value.get(k) in (None, "")]
      if unset == required:
        return None
      if unset:
        raise ConfigError(f"{where}: {unset} must be set too (or none of {required})")
      return from_mapping(nested, value, where)
    return from_mapping(nested, value, where, base=default)
  args = typing.get_args(hint) if isinstance(hint, types.UnionType) else ()
  if value is None:
    if type(None) in args:
      return None
    raise ConfigError(f"{where}: must be set")
  base = next((a for a in args if a is not type(None)), hint) if args else hint
  origin = typing.get_origin(base) or base
  if origin is tuple and isinstance(value, (list, tuple)):
    return tuple(value)
  if origin is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if origin in (str, int, float, bool, dict) and not isinstance(value, origin) or (
      origin is int and isinstance(value, bool)):
    raise ConfigError(f"{where}: expected {origin.__name__}, got {type(value).__name__} {value!r}")
  return value


def from_mapping(cls: type[T], values: Mapping[str, Any], where: str, base: T | None = None) -> T:
  """Builds dataclass `cls` (or updates `base`) from `values`, recursing into nested dataclasses."""
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ConfigError(f"{where}: unknown field(s) {unknown}; {cls.__name__} has {sorted(fields)}")
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in values.items():
    f = fields[name]
    if base is not None:
      default = getattr(base, name)
    elif f.default is not dataclasses.MISSING:
      default = f.default
    elif f.default_factory is not dataclasses.MISSING:
      default = f.default_factory()
    else:
      default = None
    kwargs[name] = _convert(hints[name], value, f"{where}.{name}", default)
  try:
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
  except ConfigError:
    raise
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{where}: {e}") from None


def eval_config(config: Mapping[str, Any] | Any) -> EvalConfig:
  """The EvalConfig of a ConfigDict (or plain nested dict)."""
  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  if not values.get("tasks"):
    raise ConfigError("config.tasks: must be set (--config.tasks=PATH)")
  cfg = from_mapping(EvalConfig, values, "config")
  # `--config.task_ids=a,b` arrives as ("a,b",)
  cfg = dataclasses.replace(cfg, task_ids=tuple(
      i.strip() for item in cfg.task_ids for i in item.split(",") if i.strip()))
  judge = cfg.rollout.judge
  if judge is not None and not judge.api_key and os.environ.get(JUDGE_KEY_ENV):
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
        cfg.rollout, judge=dataclasses.replace(judge, api_key=os.environ[JUDGE_KEY_ENV])))
  return cfg
