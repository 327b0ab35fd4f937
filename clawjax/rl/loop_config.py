"""The RL run's typed configuration, built from an ml_collections ConfigDict (configs/*.py).

The ConfigDict mirrors `TrainConfig` field by field (nested sections are the dataclasses named in
the field types: `shim` is clawjax.serving.server.ShimConfig, `rollout` clawjax.harness.rollout.
RolloutConfig, `filters` clawjax.tree.filters.FilterConfig, `learner` clawjax.rl.config.LearnerConfig,
...). A field left out keeps its default; an unknown or mistyped one is an error naming its path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from clawjax.evaluation.config import ConfigError, from_mapping
from clawjax.harness.adapters import ADAPTERS
from clawjax.harness.rollout import RolloutConfig
from clawjax.rl.config import LearnerConfig
from clawjax.rl.loop_batch import BatchConfig
from clawjax.rl.loop_sft import SFTConfig
from clawjax.serving.server import ShimConfig
from clawjax.sharding import MeshConfig
from clawjax.tree.filters import FilterConfig

ENGINE_BACKENDS = ("embedded", "sglang", "vllm")


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  # A preset (clawjax.models.config.PRESETS) or a Hugging Face safetensors directory.
  init: str = "test-tiny"
  # Random weights of the preset's architecture even where the preset has real ones (smollm2-135m).
  random_init: bool = False
  # ModelConfig fields to change: architecture sizes (random init only) or run-time fields
  # (dtype, param_dtype, attention_impl, remat).
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  template: str | None = None         # tokenizer + chat template source; None: `init`
  template_family: str | None = None  # "qwen3" | "chatml"; None: guessed


@dataclasses.dataclass(frozen=True)
class EngineSettings:
  backend: str = "embedded"  # embedded (in-process JAX engine, updated in place) | sglang | vllm
  url: str | None = None     # sglang / vllm server root
  # embedded: clawjax.engine.engine.EngineConfig fields; others: backend factory keyword arguments.
  options: dict[str, Any] = dataclasses.field(default_factory=dict)
  # sglang / vllm: where new weights are exported (safetensors) for the engine to load; it must see
  # this path. None: WORKDIR/export.
  export_dir: str | None = None

  def __post_init__(self):
    if self.backend not in ENGINE_BACKENDS:
      raise ConfigError(f"config.engine.backend: {self.backend!r} is not one of {ENGINE_BACKENDS}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  tasks: str                                # task dir / directory of tasks / JSONL (clawjax.tasks)
  harnesses: tuple[str, ...] = ("openclaw",)  # several = mix-harness: one GRPO group per (task, harness)
  task_ids: tuple[str, ...] = ()            # train only on these; () = all
  tasks_per_step: int = 32                  # paper: 32 (GRPO), 256 (PPO)
  rollouts_per_task: int = 8                # paper: 8 (GRPO), 1 (PPO)
  steps: int = 200                          # RL steps (paper: stable over 200-400)
  seed: int = 0                             # model init, task order, SFT draws
  concurrency: int = 64                     # rollouts in flight
  value_pretrain_steps: int = 0             # critic-only updates before the first policy update (PPO)
  checkpoint_every: int = 1                 # RL steps between Orbax checkpoints (the last is always saved)
  keep_checkpoints: int = 3
  eval_tasks: str | None = None             # held-out tasks; None = no periodic evaluation
  eval_every: int = 0                       # RL steps between evaluations (0 = off)
  eval_samples: int = 1                     # rollouts per held-out task and harness
  progress: bool = True                     # tqdm bar over each step's rollouts
  tensorboard: bool = True                  # mirror metrics.jsonl to WORKDIR/tb
  plot: bool = True                         # write WORKDIR/*.png curves at the end
  model: ModelSettings = ModelSettings()
  engine: EngineSettings = EngineSettings()
  mesh: MeshConfig = MeshConfig(data=1)     # learner mesh; without a -1 axis the first devices are used
  shim: ShimConfig = dataclasses.field(default_factory=lambda: ShimConfig(log_dir=""))
  rollout: RolloutConfig = RolloutConfig()
  filters: FilterConfig = FilterConfig()
  batch: BatchConfig = BatchConfig()
  learner: LearnerConfig = LearnerConfig()
  sft: SFTConfig = SFTConfig()

  def __post_init__(self):
    checks = [
        ("harnesses", self.harnesses and set(self.harnesses) <= set(ADAPTERS),
         f"must be a non-empty subset of {sorted(ADAPTERS)}"),
        ("tasks_per_step", self.tasks_per_step >= 1, "must be >= 1"),
        ("rollouts_per_task", self.rollouts_per_task >= 1, "must be >= 1"),
        ("steps", self.steps >= 1, "must be >= 1"),
        ("concurrency", self.concurrency >= 1, "must be >= 1"),
        ("checkpoint_every", self.checkpoint_every >= 1, "must be >= 1"),
        ("shim.log_dir", not self.shim.log_dir, "is set by the run (WORKDIR/calls); leave it out"),
        # log pi_old must be computed at the temperature the engine sampled at (Eq. 4's ratio).
        ("learner.temperature", math.isclose(self.learner.temperature, self.shim.temperature),
         f"{self.learner.temperature} differs from shim.temperature {self.shim.temperature}"),
        ("value_pretrain_steps", self.value_pretrain_steps == 0 or self.learner.value.kind != "none",
         "needs learner.value.kind 'shared' or 'separate'"),
        ("eval_tasks", not self.eval_every or self.eval_tasks, "required when eval_every > 0"),
    ]
    for field, ok, message in checks:
      if not ok:
        raise ConfigError(f"config.{field}: {message}")


def train_config(config: Mapping[str, Any] | Any) -> TrainConfig:
  """The TrainConfig of a ConfigDict (or a plain nested dict)."""
  values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  if not values.get("tasks"):
    raise ConfigError("config.tasks: must be set (--config.tasks=PATH)")
  return from_mapping(TrainConfig, values, "config")
