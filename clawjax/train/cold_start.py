"""Cold-start SFT before RL (the paper's OpenClaw runs start from a light SFT, "ClawII-Cold").

Demonstrations go through the same path as RL rollouts: the real harness talks to the shim, whose
backend is a scripted demonstrator instead of the model, so the recorded token ids are exactly what the
harness and template produce. The trees of those calls are trained with token-level cross-entropy (the
"sft" loss, clawjax.rl.losses).

A demonstrator plays the model: `sft.demonstrator` names a factory "MODULE:NAME" called as
`factory(template, **sft.demonstrator_args)` that returns a function of the prompt ids giving the turn
to play (clawjax.serving.backends.scripted.ScriptTurn). The quickstart's lives with its tasks
(clawjax/data/quickstart/demonstrator.py).
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any

import numpy as np

from clawjax import config as config_lib
from clawjax.calllog import CallLogWriter, load
from clawjax.config import ConfigError
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.run.session import PolicySession, RolloutJob, chat_template
from clawjax.serving.backends.scripted import ScriptedBackend
from clawjax.tasks import Task
from clawjax.train.metrics import MetricsWriter
from clawjax.train.step_data import failure_reasons
from clawjax.tree.batch import RolloutScores
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.pack import pack_trees

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 0                   # SFT updates; 0 = no SFT stage
  lr: float = 3e-3                 # a small model from scratch needs a large step (quickstart value)
  demos_per_task: int = 8          # demonstrations recorded per task
  rows: int = 8                    # trees per SFT update (one tree per row)
  row_len: int = 1024              # longest demonstration tree
  concurrency: int = 8             # demonstration rollouts in flight
  # "MODULE:NAME" of the demonstrator factory (module docstring); required when steps > 0.
  demonstrator: str = ""
  demonstrator_args: dict[str, Any] = dataclasses.field(default_factory=dict)


def check_demonstrator(config: SFTConfig, where: str = "config.sft") -> Any:
  """The demonstrator factory of `config`, imported (a ConfigError naming the field if it cannot be)."""
  if not config.demonstrator:
    raise ConfigError(f"{where}.demonstrator: must be set when sft.steps > 0 (MODULE:NAME)")
  factory = config_lib.import_object(config.demonstrator, f"{where}.demonstrator")
  if not callable(factory):
    raise ConfigError(f"{where}.demonstrator: {config.demonstrator!r} is not callable")
  return factory


def record_demos(cfg, tasks: list[Task], out_dir: pathlib.Path) -> tuple[list[CallTree], RolloutScores]:
  """Runs `cfg.sft.demos_per_task` demonstrations of every task through the first harness of the
  TrainConfig `cfg`; returns their trees (sorted by content, so the order is reproducible)."""
  sft = cfg.sft
  calls_dir = out_dir / "calls"
  with PolicySession(cfg, calls_dir, backend=_demonstrator_backend(cfg)) as session, \
       CallLogWriter(out_dir / "rollouts.jsonl") as writer:
    jobs = [RolloutJob(t, cfg.harnesses[0], k) for t in tasks for k in range(sft.demos_per_task)]
    session.run(jobs, writer, label="sft", desc="cold-start demonstrations", concurrency=sft.concurrency)
  loaded = load([calls_dir, out_dir / "rollouts.jsonl"], errors="collect")
  ok = [r for r in loaded.rollouts.values() if r.status == "ok"]
  trees = [filter_rollout(r.rollout_id, loaded.calls.get(r.rollout_id, []), FilterConfig()).tree for r in ok]
  trees = [t for t in trees if t.size]
  if not trees:
    raise RuntimeError(f"SFT: no usable demonstration among {len(jobs)} (see {out_dir}); "
                       f"why: {' | '.join(failure_reasons(loaded) or ['no ok rollout has a trained call'])[:2000]}")
  log.info("SFT: %d demonstrations of %d usable", len(trees), len(jobs))
  return sorted(trees, key=lambda t: t.tokens_T.tobytes()), grpo_advantages(ok)


def _demonstrator_backend(cfg) -> ScriptedBackend:
  template = chat_template(cfg.model)
  policy = check_demonstrator(cfg.sft)(template, **cfg.sft.demonstrator_args)
  return ScriptedBackend(template, policy)


def run_sft(policy, trees: list[CallTree], scores: RolloutScores, config: SFTConfig,
            learner_config: LearnerConfig, metrics: MetricsWriter, seed: int):
  """`config.steps` cross-entropy updates on random draws of `rows` demonstration trees; returns the
  trained policy module."""
  sft_cfg = dataclasses.replace(learner_config, loss="sft", lr=config.lr, kl_coef=0.0, warmup_steps=0,
                                micro_batches=1, epochs=1, minibatches=1, shuffle=False,
                                value=dataclasses.replace(learner_config.value, kind="none"))
  learner = Learner(sft_cfg, policy)
  rng = np.random.default_rng(seed)
  for step in range(1, config.steps + 1):
    pick = rng.choice(len(trees), size=config.rows, replace=len(trees) < config.rows)
    batch = pack_trees([trees[i] for i in pick], scores, row_len=config.row_len, rows=config.rows)
    m = learner.step(learner.prepare(batch))
    metrics.write("sft", step, {"nll": m["nll"], "grad_norm": m["grad_norm"], "step_seconds": m["step_seconds"]})
    if step % 10 == 0 or step == config.steps:
      log.info("SFT step %d/%d: nll %.4f", step, config.steps, m["nll"])
  return learner.policy_model()
