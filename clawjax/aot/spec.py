"""What a compile needs from a train or SFT config: the model, mesh, learner and packed batch shape.

Only these sections are resolved (with the `--config.` overrides), so a paper config compiles with its
launch-time placeholders (tasks, engine URL, weights path) unset: nothing of them reaches the step.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from clawjax import config as config_lib
from clawjax.config import ConfigError
from clawjax.models.config import PRESETS, ModelConfig, unknown_model
from clawjax.rl.config import LearnerConfig
from clawjax.sft.config import SFTRunConfig
from clawjax.sharding import CompileTarget, MeshConfig
from clawjax.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class StepSpec:
  model: ModelConfig
  model_name: str           # the preset or directory the architecture came from
  mesh: MeshConfig
  learner: LearnerConfig
  rows: int                 # packed rows per learner step
  row_len: int              # tokens per row
  topology: str | None      # the config's compile.topology


def _is_rl(values: Mapping[str, Any]) -> bool:
  """An RL config (TrainConfig: tasks, a `batch` section) rather than the SFT stage's (SFTRunConfig)."""
  return "batch" in values or "tasks" in values


def _run_config_class(values: Mapping[str, Any]) -> type:
  return TrainConfig if _is_rl(values) else SFTRunConfig


def _section(cls: type, values: Mapping[str, Any], name: str) -> Any:
  """Field `name` of dataclass `cls` from `values`, over the field's default."""
  field = {f.name: f for f in dataclasses.fields(cls)}[name]
  default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
  if name not in values:
    return default
  if dataclasses.is_dataclass(default):
    return config_lib.from_mapping(type(default), values[name], f"config.{name}", base=default, root=cls)
  return values[name]


def _model(settings: Any, target: CompileTarget) -> tuple[ModelConfig, str]:
  name = settings.init or target.model
  if not name:
    raise ConfigError("config.model.init: unset, and config.compile.model names no preset to compile instead")
  overrides = dict(settings.overrides)
  problem = unknown_model(name)
  if problem:
    raise ConfigError(f"config.model.init: {problem}")
  if name in PRESETS:
    return PRESETS[name].replace(**overrides), name
  hf = pathlib.Path(name) / "config.json"
  return ModelConfig.from_hf_config(json.loads(hf.read_text()), **overrides), name


def step_spec(config: Any, overrides: Sequence[str] = ()) -> StepSpec:
  """The StepSpec of a config file's ConfigDict (or nested dict) with `--config.a.b=v` overrides."""
  values = config.to_dict() if hasattr(config, "to_dict") else json.loads(json.dumps(config, default=list))
  cls = _run_config_class(values)
  for item in overrides:
    path, value = config_lib.parse_override(cls, item)
    *parents, leaf = path.split(".")
    node = values
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  section = lambda name: _section(cls, values, name)
  model, model_name = _model(section("model"), section("compile"))
  if _is_rl(values):
    rows, row_len = section("batch").rows, section("batch").row_len
  else:
    rows, row_len = section("rows"), section("max_len")
  return StepSpec(model=model, model_name=model_name, mesh=section("mesh"), learner=section("learner"),
                  rows=rows, row_len=row_len, topology=section("compile").topology)
