"""The RL run's typed configuration: `TrainConfig`, built from a config file and `--config.` overrides.

The ConfigDict of a config file (configs/*.py) sets some fields of `TrainConfig`; every other field keeps
its default, and every field can be set from the command line (clawjax.config). Nested sections are
the dataclasses named in the field types: `model`/`engine` clawjax.run.settings, `shim`
clawjax.serving.server.ShimConfig, `rollout` clawjax.harness.rollout.RolloutConfig, `filters`
clawjax.tree.filters.FilterConfig, `batch` clawjax.train.step_data.BatchConfig, `learner`
clawjax.rl.config.LearnerConfig, `sft` clawjax.train.cold_start.SFTConfig, `mesh` clawjax.sharding.MeshConfig.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from clawjax import config as config_lib
from clawjax.config import ConfigError, Count, NonNegative
from clawjax.distributed import DistributedConfig
from clawjax.harness.adapters import ADAPTERS
from clawjax.harness.rollout import RolloutConfig
from clawjax.rl.config import LearnerConfig
from clawjax.rl.losses import check_loss
from clawjax.run.settings import EngineSettings, ModelSettings, harness_context_problem
from clawjax.serving.server import ShimConfig
from clawjax.sharding import CompileTarget, MeshConfig
from clawjax.train.cold_start import SFTConfig, check_demonstrator
from clawjax.train.step_data import BatchConfig
from clawjax.tree.filters import FilterConfig

# Engines whose weights the trainer can replace after each update, with a version every answer reports.
# (vLLM's server has no weight update in its public API: it serves evaluation.)
TRAINABLE_BACKENDS = ("embedded", "sglang")
# Fields a resumed run may change without --config.allow_config_change: they decide how long the run
# goes, how it reports, where its services are (a restarted cluster) and how its rollouts are isolated
# and kept on this host, not what it trains on.
RESUMABLE_CHANGES = ("steps", "progress", "plot", "tensorboard", "concurrency", "checkpoint_every",
                     "keep_checkpoints", "allow_config_change", "eval_every", "eval_samples",
                     "empty_step_retries", "max_skipped_steps", "failing_harness_steps", "engine.url",
                     "engine.export_dir", "engine.push_mode", "rollout.work_root", "rollout.sandbox",
                     "rollout.keep_dirs", "rollout.cores", "distributed", "compile")


SFT_ONE_PROCESS = ("the cold start through the harness runs in one process; with several, set sft.steps=0 "
                   "and start from a cold-start model as model.init: build it with experiments/sft.py, which "
                   "runs on the same processes with the same --config.distributed.* flags")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  tasks: str                                # task dir / directory of tasks / JSONL (clawjax.tasks)
  harnesses: tuple[str, ...] = ("openclaw",)  # several = mix-harness: one GRPO group per (task, harness)
  task_ids: tuple[str, ...] = ()            # train only on these; () = all
  tasks_per_step: Count = 32                # paper: 32 (GRPO), 256 (PPO)
  rollouts_per_task: Count = 8              # paper: 8 (GRPO), 1 (PPO)
  steps: Count = 200                        # RL steps (paper: stable over 200-400)
  seed: int = 0                             # model init, task order, SFT draws
  concurrency: Count = 64                   # rollouts in flight
  value_pretrain_steps: NonNegative[int] = 0  # critic-only updates before the first policy update (PPO)
  checkpoint_every: Count = 1               # RL steps between Orbax checkpoints (the last is always saved)
  keep_checkpoints: Count = 3
  eval_tasks: str | None = None             # held-out tasks; None = no periodic evaluation
  eval_every: NonNegative[int] = 0          # RL steps between evaluations (0 = off)
  eval_samples: Count = 1                   # rollouts per held-out task and harness
  progress: bool = True                     # tqdm bar over each step's rollouts
  tensorboard: bool = True                  # mirror metrics.jsonl to WORKDIR/tb (needs clawjax[tensorboard])
  plot: bool = True                         # write WORKDIR/*.png curves at the end
  # Modules (dotted names or .py paths) imported before the config is checked: they register losses,
  # demonstrators, harness adapters of your own.
  plugins: tuple[str, ...] = ()
  # Resume even though the config differs from the one the run started with (config.json).
  allow_config_change: bool = False
  # Asynchronous RL: rollouts of later steps (up to batch.max_staleness steps ahead) run while the
  # learner updates; a step trains the earliest launched completed groups (a straggler waits for a later
  # step as long as it can still be trained within batch.max_staleness versions of its launch) and
  # drops groups with calls sampled more than batch.max_staleness versions ago, or by no known version
  # (clawjax/train/async_loop.py). Off: the paper's synchronous recipe (the reference).
  async_rl: bool = False
  # A step whose rollouts give nothing to train (every rollout failed, timed out or was excluded) is run
  # again this many times, then the run stops with the failures' reasons.
  empty_step_retries: NonNegative[int] = 2
  # The run stops after this many consecutive steps with an update skipped for a non-finite loss or
  # gradient (the parameters were kept; the message names the step data to inspect).
  max_skipped_steps: Count = 3
  # The run stops, naming the harness and its reason, after this many steps in a row in which a harness
  # failed every one of its rollouts the same way (clawjax/train/failing_harness.py); 0: never.
  failing_harness_steps: NonNegative[int] = 1
  model: ModelSettings = ModelSettings()
  engine: EngineSettings = EngineSettings()
  # The learner's mesh: every device of every process by default (data parallel); without a -1 axis,
  # the first devices (one process only).
  mesh: MeshConfig = MeshConfig(data=-1)
  # Several processes (one per host, the same command on each): clawjax.distributed.DistributedConfig.
  distributed: DistributedConfig = DistributedConfig()
  compile: CompileTarget = CompileTarget()
  shim: ShimConfig = dataclasses.field(default_factory=lambda: ShimConfig(log_dir=""))
  rollout: RolloutConfig = RolloutConfig()
  filters: FilterConfig = FilterConfig()
  batch: BatchConfig = BatchConfig()
  learner: LearnerConfig = LearnerConfig()
  sft: SFTConfig = SFTConfig()

  def __post_init__(self):
    config_lib.import_plugins(self.plugins)
    context = harness_context_problem(self.harnesses, self.shim.max_context, self.engine)
    checks = [
        ("tasks", self.tasks and pathlib.Path(self.tasks).exists(), f"{self.tasks!r} does not exist"),
        ("harnesses", self.harnesses and set(self.harnesses) <= set(ADAPTERS),
         f"{list(self.harnesses)} must be a non-empty subset of {sorted(ADAPTERS)}"),
        ("rollout.harness.codex_compact_reserve", "codex" not in self.harnesses
         or 0 <= self.rollout.harness.codex_compact_reserve < self.shim.max_context,
         f"{self.rollout.harness.codex_compact_reserve} must be at least 0 and below shim.max_context"),
        ("harnesses", not context, context),
        ("engine.backend", self.engine.backend in TRAINABLE_BACKENDS,
         f"{self.engine.backend!r}: training updates the engine's weights, so one of {TRAINABLE_BACKENDS}"),
        ("shim.log_dir", not self.shim.log_dir, "is set by the run (WORKDIR/calls); leave it out"),
        # log pi_old must be computed at the temperature the engine sampled at (Eq. 4's ratio).
        ("learner.temperature", math.isclose(self.learner.temperature, self.shim.temperature),
         f"{self.learner.temperature} differs from shim.temperature {self.shim.temperature}"),
        # The logged log-probs are the full distribution's (before truncation), so with top-p / top-k
        # the TIS denominator would not be the distribution the tokens were sampled from.
        ("shim.top_p", self.shim.top_p == 1.0, f"{self.shim.top_p}: training samples from the full "
         "distribution (the logged log-probs are taken before truncation); use 1.0"),
        ("shim.top_k", self.shim.top_k <= 0, f"{self.shim.top_k}: training samples from the full "
         "distribution (the logged log-probs are taken before truncation); use -1"),
        ("shim.workers", self.shim.workers == 1 or self.engine.backend != "embedded",
         f"{self.shim.workers} shim processes cannot share the embedded engine: serve the model with "
         "`python -m clawjax.engine` and use engine.backend=sglang, or one shim process"),
        ("value_pretrain_steps", self.value_pretrain_steps == 0 or self.learner.value.kind != "none",
         "needs learner.value.kind 'shared' or 'separate'"),
        ("eval_tasks", not self.eval_every or self.eval_tasks, "required when eval_every > 0"),
        ("sft.steps", not (self.sft.steps and self.distributed.multi_process), SFT_ONE_PROCESS),
        # PPO's advantages come from the critic (R - V), not from the group: at the paper's one rollout per
        # task every group has A = 0 and would be dropped whole.
        ("batch.drop_uninformative_groups", not (self.batch.drop_uninformative_groups and self.learner.loss == "ppo"),
         "drops the groups whose GRPO advantages are all 0, but learner.loss 'ppo' takes its advantages from "
         "the critic; turn it off"),
        ("async_rl", not self.async_rl or self.batch.max_staleness >= 1,
         "needs batch.max_staleness >= 1 (how many steps of rollouts may run ahead of the learner); it is 0"),
    ]
    for field, ok, message in checks:
      if not ok:
        raise ConfigError(f"config.{field}: {message}")
    self.model.check_loadable()
    check_loss(self.learner)
    if self.sft.steps:
      check_demonstrator(self.sft)
    config_lib.check_tensorboard(self.tensorboard)


def train_config(config: Mapping[str, Any] | Any, overrides: Sequence[str] = ()) -> TrainConfig:
  """The TrainConfig of a ConfigDict (or a plain nested dict), with `--config.` overrides applied."""
  return config_lib.resolve(TrainConfig, config, overrides)


def check_resume(saved: Mapping[str, Any], cfg: TrainConfig) -> None:
  """A resumed run must train what it started with: a ConfigError listing the differences from the
  run's config.json (beyond RESUMABLE_CHANGES) unless `allow_config_change`."""
  config_lib.check_resume(saved, cfg, RESUMABLE_CHANGES, cfg.allow_config_change)
