"""The evaluation's typed configuration: `EvalConfig`, built from a config file (configs/eval/*.py) and
`--config.` overrides (clawjax.config).

Sections: `model` and `engine` (clawjax.run.settings, the same keys as in training), `shim`
(clawjax.serving.server.ShimConfig), `rollout` (clawjax.harness.rollout.RolloutConfig, with its nested
`harness`, `sandbox`, `scoring`, `judge`). An optional component whose required fields are unset (e.g.
`rollout.judge` without `url` and `model`) is off.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from clawjax import config as config_lib
from clawjax.config import ConfigError, Count, NonNegative
from clawjax.distributed import DistributedConfig
from clawjax.evaluation.report import TRAINED_IN_BASES
from clawjax.evaluation.results import STATUSES
from clawjax.evaluation.summary import UNSCORED_CHOICES
from clawjax.harness.adapters import ADAPTERS
from clawjax.harness.rollout import RolloutConfig
from clawjax.run.settings import EngineSettings, ModelSettings
from clawjax.serving.server import ShimConfig

JUDGE_KEY_ENV = "CLAWJAX_JUDGE_KEY"  # the judge's API key comes from here, never from a config file


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  tasks: str  # a task directory, a directory of tasks, a JSONL file or a PinchBench tasks/ dir
  harness: str = "openclaw"  # adapter name: openclaw, claude_code, codex, mini
  benchmark: str = "ClawGym-Bench"  # the Table 1 column this run fills
  model_label: str | None = None  # the Table 1 row name; None: the engine model's base name
  # Which repeat of (harness, model_label, benchmark) this run is, e.g. the training seed of the policy
  # evaluated: tables.py averages runs of different seeds (mean, bootstrap interval over seeds) and merges
  # runs of one seed (a benchmark split over machines). The engine's sampling seed is engine.options.seed.
  seed: int = 0
  # The harness the evaluated policy was RL-trained in (an adapter name; several joined by "+" for a
  # mixed-harness run), "base" (no training) or "cold_start" (SFT only): the row of the transfer matrix
  # (`tables.py --transfer`). None: not stated; the transfer matrix leaves the run out.
  trained_in: str | None = None
  task_ids: tuple[str, ...] = ()  # evaluate only these tasks (`--config.task_ids=a,b`); () = all
  max_tasks: NonNegative[int] = 0  # evaluate only the first N tasks in load order; 0 = all
  num_samples: Count = 1  # rollouts per task; a task scores the mean over them
  concurrency: Count = 8  # rollouts in flight at once
  rerun_statuses: tuple[str, ...] = ("failed",)  # a resumed run redoes rollouts last recorded so
  unscored: str = "zero"  # how a rollout with no score counts: see clawjax/evaluation/summary.py
  # Use a task's own wall clock (PinchBench `timeout_seconds`) for its rollout and harness where it
  # has one, instead of rollout.timeout_s.
  task_timeouts: bool = False
  progress: bool = True  # tqdm progress bar on stderr
  shim_url: str | None = None  # connect to a running shim instead of starting one
  # With shim_url: the file that shim wrote its admin token to (python -m clawjax.serving prints it);
  # None: $CLAWJAX_ADMIN_TOKEN.
  shim_token_file: str | None = None
  # Modules (dotted names or .py paths) imported before the config is checked (harness adapters of
  # your own, ...).
  plugins: tuple[str, ...] = ()
  model: ModelSettings = ModelSettings(init=None)
  engine: EngineSettings = EngineSettings()
  shim: ShimConfig = dataclasses.field(default_factory=lambda: ShimConfig(log_dir=""))
  rollout: RolloutConfig = RolloutConfig()
  # Several processes (one per host, the same command on each) split the tasks: clawjax.distributed.
  distributed: DistributedConfig = DistributedConfig()

  def __post_init__(self):
    config_lib.import_plugins(self.plugins)
    checks = [
        ("tasks", self.tasks and pathlib.Path(self.tasks).exists(), f"{self.tasks!r} does not exist"),
        ("harness", self.harness in ADAPTERS, f"{self.harness!r} is not one of {sorted(ADAPTERS)}"),
        ("rollout.harness.codex_compact_reserve", self.harness != "codex"
         or 0 <= self.rollout.harness.codex_compact_reserve < self.shim.max_context,
         f"{self.rollout.harness.codex_compact_reserve} must be at least 0 and below shim.max_context"),
        ("unscored", self.unscored in UNSCORED_CHOICES, f"not one of {UNSCORED_CHOICES}"),
        ("rerun_statuses", set(self.rerun_statuses) <= set(STATUSES), f"not a subset of {STATUSES}"),
        ("shim.log_dir", not self.shim.log_dir, "is set by the run (WORKDIR/calls); leave it out"),
        ("model.init", self.shim_url or self.model.init, "required unless shim_url is set"),
        ("shim.workers", self.shim.workers == 1 or self.engine.backend != "embedded",
         f"{self.shim.workers} shim processes cannot share the embedded engine: serve the model with "
         "`python -m clawjax.engine` and use engine.backend=sglang, or one shim process"),
        ("trained_in", self.trained_in is None or self.trained_in in TRAINED_IN_BASES
         or set(self.trained_in.split("+")) <= set(ADAPTERS),
         f"{self.trained_in!r} is not one of {TRAINED_IN_BASES}, a harness ({sorted(ADAPTERS)}) or harnesses "
         "joined by '+'"),
    ]
    for field, ok, message in checks:
      if not ok:
        raise ConfigError(f"config.{field}: {message}")
    if self.engine.backend == "embedded" and not self.shim_url:  # the run loads the model itself
      self.model.check_loadable()

  @property
  def label(self) -> str:
    if self.model_label:
      return self.model_label
    return os.path.basename(os.path.normpath(self.model.init)) if self.model.init else "policy"


def eval_config(config: Mapping[str, Any] | Any, overrides: Sequence[str] = ()) -> EvalConfig:
  """The EvalConfig of a ConfigDict (or plain nested dict), with `--config.` overrides applied; the
  judge's key comes from $CLAWJAX_JUDGE_KEY."""
  cfg = config_lib.resolve(EvalConfig, config, overrides)
  judge = cfg.rollout.judge
  if judge is not None and not judge.api_key and os.environ.get(JUDGE_KEY_ENV):
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
        cfg.rollout, judge=dataclasses.replace(judge, api_key=os.environ[JUDGE_KEY_ENV])))
  return cfg
