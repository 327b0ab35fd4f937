"""The SFT stage's typed configuration: `SFTRunConfig`, from a config file (configs/sft/*.py) and
`--config.` overrides (clawjax.config).

Published values (ClawGym part I, ClawGym-Agents' SFT launch script, OpenRLHF `train_sft` for the dense
models; the paper trains its MoE with an unpublished Megatron setup): 3 epochs, learning rate 1e-5,
max length 65536, 128 conversations per update, loss on the assistant turns only. What the script leaves
at OpenRLHF's defaults is the default here too: AdamW with betas (0.9, 0.95) and no weight decay,
gradient clipping at 1.0, a linear warm-up over 3% of the updates, then a cosine decay to 10% of the peak
(`cosine_with_min_lr`). Sections: `model` (clawjax.run.settings.ModelSettings, as in training),
`learner` (clawjax.rl.config.LearnerConfig, the `sft` loss), `mesh` (clawjax.sharding.MeshConfig),
`distributed` (clawjax.distributed.DistributedConfig: several processes run one stage).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from clawjax import config as config_lib
from clawjax.config import ConfigError, Count, Fraction, FractionBelow1, NonNegative, Range
from clawjax.distributed import DistributedConfig
from clawjax.rl.config import LearnerConfig
from clawjax.rl.losses import check_loss
from clawjax.run.settings import ModelSettings
from clawjax.sharding import CompileTarget, MeshConfig
from clawjax.tree.filters import FilterConfig

BAD_LINES = ("stop", "skip")     # a malformed line stops the run, or is skipped and counted
OVERLONG = ("cut", "drop")       # a conversation over max_len is cut at a turn boundary, or dropped
# A `calls` run directory's rollout records, as globs below it: a train run's per step, an eval run's one
# file (a train run's held-out evaluations, eval/, are left out); their calls are read from its calls/.
ROLLOUT_FILES = ("rollouts.jsonl", "steps/*/rollouts.jsonl")
# Fields a resumed run may change without --config.allow_config_change: how it reports, checkpoints and
# exports, not what it trains on or its schedule (which follows from the number of updates); and how
# many processes share the work (each passes its own process_id).
RESUMABLE_CHANGES = ("progress", "tensorboard", "checkpoint_every", "keep_checkpoints", "eval_every",
                     "allow_config_change", "export_dir", "distributed", "compile")


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where trajectories come from: paths per format (a comma list on the command line)."""
  # JSONL, one conversation a line in the OpenAI Chat format: {"messages": [...], "tools": [...]}, with
  # assistant `tool_calls` and `tool` results (ClawGym's SFT data, OpenRLHF's and most SFT sets' format).
  openai: tuple[str, ...] = ()
  # JSONL, one conversation a line in the Anthropic Messages format: {"system", "messages", "tools"},
  # with tool_use / tool_result blocks (what Claude Code sends).
  anthropic: tuple[str, ...] = ()
  # Directories of train or eval runs: the trees of their rollouts scored >= min_score (RFT).
  calls: tuple[str, ...] = ()

  def paths(self) -> list[tuple[str, str]]:
    """(format, path) of every source."""
    return [(name, p) for name in ("openai", "anthropic", "calls") for p in getattr(self, name)]


@dataclasses.dataclass(frozen=True)
class SFTRunConfig:
  data: DataConfig = DataConfig()
  # Held-out trajectories for the held-out loss; none given: `heldout_fraction` of `data`'s
  # conversations (a seeded choice), or no held-out loss when that is 0.
  heldout: DataConfig = DataConfig()
  heldout_fraction: FractionBelow1 = 0.0
  # RFT: a rollout of a `calls` source is trained when its status is ok and its reward >= min_score
  # (ClawGym's checkers score in [0, 1]; 1.0 keeps the fully solved rollouts).
  min_score: float = 1.0
  rollout_files: tuple[str, ...] = ROLLOUT_FILES  # a `calls` run's rollout records (globs, see above)
  filters: FilterConfig = FilterConfig()  # which logged calls of a rollout are trained (as in RL)
  # Tools (a JSON list in the source's own format) for conversations without a `tools` field: ClawGym's
  # SFT data leaves them out, its tokenising script adds OpenClaw's tool list to every conversation.
  tools_file: str | None = None
  # The generation prompt the harness asks for (Qwen3: False opens each assistant turn with an empty
  # think block); None: the template's default, as for a request that does not say.
  enable_thinking: bool | None = None
  bad_lines: str = "stop"          # "stop" | "skip" (each skipped line is counted and logged)
  max_len: Annotated[int, Range(low=8)] = 65536  # ClawGym; also the length of a packed row
  overlong: str = "cut"            # "cut" (at an assistant turn's end) | "drop"; counted either way
  rows: Count = 128                # packed rows per update (ClawGym: 128 conversations an update)
  # Length binning: conversations are dealt in a seeded order into pools of this many updates' worth of
  # tokens; each pool is packed largest first into rows (first-fit decreasing), and the rows shuffled.
  pool_batches: Count = 8
  epochs: Count = 3                # ClawGym
  steps: NonNegative[int] = 0      # stop after this many updates; 0 = all of `epochs`
  warmup_ratio: FractionBelow1 = 0.03  # linear warm-up over this fraction of the updates (OpenRLHF)
  min_lr_ratio: Fraction = 0.1     # cosine decay to this fraction of learner.lr (OpenRLHF); 1.0 = constant
  # Held-out loss every N updates (and always before the first and after the last); 0 = only then
  # (ClawGym: eval_steps -1).
  eval_every: NonNegative[int] = 0
  checkpoint_every: Count = 80     # ClawGym (save_steps); the last update is always saved
  keep_checkpoints: Count = 3      # OpenRLHF's max_ckpt_num default (ClawGym keeps 10)
  export_dir: str | None = None    # the Hugging Face directory written at the end; None: WORKDIR/hf
  seed: int = 0                    # held-out choice, data order, learner RNG
  progress: bool = True            # tqdm bar over the updates
  tensorboard: bool = True         # mirror metrics.jsonl to WORKDIR/tb (needs clawjax[tensorboard])
  allow_config_change: bool = False  # resume although the config differs from the run's config.json
  model: ModelSettings = ModelSettings(init=None)
  learner: LearnerConfig = LearnerConfig(loss="sft", lr=1e-5, adam_b2=0.95)
  mesh: MeshConfig = MeshConfig(data=1)  # the learner's mesh; with several processes, over all (data=-1)
  # Several processes (one per host, the same command on each with its own process_id) run one stage:
  # each reads the data and plans alike, then feeds its share of every update's rows (clawjax/sft/loop.py).
  distributed: DistributedConfig = DistributedConfig()
  compile: CompileTarget = CompileTarget()

  def __post_init__(self):
    learner = self.learner
    checks = [
        ("data", self.data.paths(), "no source; set data.openai, data.anthropic or data.calls"),
        ("min_score", math.isfinite(self.min_score), "must be a finite number"),
        ("bad_lines", self.bad_lines in BAD_LINES, f"{self.bad_lines!r} is not one of {BAD_LINES}"),
        ("overlong", self.overlong in OVERLONG, f"{self.overlong!r} is not one of {OVERLONG}"),
        ("learner.loss", learner.loss == "sft", f"{learner.loss!r}: the SFT stage trains the 'sft' loss"),
        ("learner.kl_coef", learner.kl_coef == 0.0, "must be 0 (no reference model in SFT)"),
        ("learner.value.kind", learner.value.kind == "none", "must be 'none' (no critic in SFT)"),
        ("learner.epochs", learner.epochs == 1 and learner.minibatches == 1,
         "learner.epochs and learner.minibatches must be 1: one update per packed batch"),
        ("learner.warmup_steps", learner.warmup_steps == 0, "use warmup_ratio (a fraction of the updates)"),
        # Cross-entropy is log softmax at temperature 1.
        ("learner.temperature", learner.temperature == 1.0, "must be 1.0 (plain cross-entropy)"),
        ("learner.micro_batches", self.rows % learner.micro_batches == 0, f"must divide rows={self.rows}"),
    ]
    for field, ok, message in checks:
      if not ok:
        raise ConfigError(f"config.{field}: {message}")
    self.model.check_loadable()
    for section in ("data", "heldout"):
      for fmt, path in getattr(self, section).paths():
        if not pathlib.Path(path).exists():
          raise ConfigError(f"config.{section}.{fmt}: {path!r} does not exist")
    if self.tools_file and not pathlib.Path(self.tools_file).is_file():
      raise ConfigError(f"config.tools_file: {self.tools_file!r} is not a file")
    check_loss(learner)
    config_lib.check_tensorboard(self.tensorboard)


def sft_config(config: Mapping[str, Any] | Any, overrides: Sequence[str] = ()) -> SFTRunConfig:
  """The SFTRunConfig of a ConfigDict (or a plain nested dict), with `--config.` overrides applied."""
  return config_lib.resolve(SFTRunConfig, config, overrides)


def check_resume(saved: Mapping[str, Any], cfg: SFTRunConfig) -> None:
  """A resumed run must train what it started with (clawjax.config.check_resume)."""
  config_lib.check_resume(saved, cfg, RESUMABLE_CHANGES, cfg.allow_config_change)
