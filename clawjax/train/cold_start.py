"""Cold-start SFT before RL (the paper's OpenClaw runs start from a light SFT, "ClawII-Cold"): the
quickstart's demonstrations, one more data source of the SFT stage (clawjax/sft).

Demonstrations go through the same path as RL rollouts: the real harness talks to the shim, whose
backend is a scripted demonstrator instead of the model, so the recorded token ids are exactly what the
harness and template produce. The recording is a run directory like any other (calls/ and
rollouts.jsonl), read by the SFT stage's call-log source (every ok demonstration, filtered as RL filters
its calls) and trained by its loop (clawjax.sft.loop: length-binned packed batches, the "sft" loss).

A demonstrator plays the model: `sft.demonstrator` names a factory "MODULE:NAME" called as
`factory(template, **sft.demonstrator_args)` that returns a function of the prompt ids giving the turn
to play (clawjax.serving.backends.scripted.ScriptTurn). The quickstart's lives with its tasks
(clawjax/data/quickstart/demonstrator.py).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import pathlib
from typing import Any

from clawjax import config as config_lib
from clawjax.calllog import CallLogWriter, load
from clawjax.config import ConfigError, Count, NonNegative, Positive
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.run.session import PolicySession, RolloutJob, chat_template
from clawjax.serving.backends.scripted import ScriptedBackend
from clawjax.sft.dataset import rollout_trees
from clawjax.sft.loop import Metrics, fit, make_plan
from clawjax.tasks import Task
from clawjax.train.step_data import failure_reasons
from clawjax.tree.build import CallTree
from clawjax.tree.vocab import refuse_trees

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: NonNegative[int] = 0      # SFT updates; 0 = no SFT stage
  lr: Positive[float] = 3e-3       # a small model from scratch needs a large step (quickstart value)
  demos_per_task: Count = 8        # demonstrations recorded per task
  rows: Count = 8                  # packed rows per SFT update
  row_len: Count = 1024            # tokens a row; a longer demonstration tree is left out (counted)
  # Length binning (clawjax.sft.packing): demonstrations are dealt into pools of this many updates'
  # worth of tokens, each packed largest first.
  pool_batches: Count = 8
  concurrency: Count = 8           # demonstration rollouts in flight
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


def record_demos(cfg, tasks: list[Task], out_dir: pathlib.Path) -> list[CallTree]:
  """Runs `cfg.sft.demos_per_task` demonstrations of every task through the first harness of the
  TrainConfig `cfg` into the run directory `out_dir`; returns the trees of its ok demonstrations (sorted
  by content, so the order is reproducible)."""
  sft = cfg.sft
  with PolicySession(cfg, out_dir / "calls", backend=_demonstrator_backend(cfg)) as session, \
       CallLogWriter(out_dir / "rollouts.jsonl") as writer:
    jobs = [RolloutJob(t, cfg.harnesses[0], k) for t in tasks for k in range(sft.demos_per_task)]
    session.run(jobs, writer, label="sft", desc="cold-start demonstrations", concurrency=sft.concurrency)
  counts: collections.Counter = collections.Counter()
  found = rollout_trees(str(out_dir), min_score=-math.inf, max_len=sft.row_len, overlong="drop", counts=counts,
                        filters=cfg.filters, bad_lines="skip")
  trees = [t for t, _ in found if t is not None]
  if not trees:
    loaded = load([out_dir / "calls", out_dir / "rollouts.jsonl"], errors="collect")
    why = " | ".join(failure_reasons(loaded) or ["no ok rollout has a trained call"])
    raise RuntimeError(f"SFT: no usable demonstration among {len(jobs)} (see {out_dir}); "
                       f"why: {why[:2000]}; counts: {dict(counts)}")
  log.info("SFT: %d demonstrations of %d usable (%s)", len(trees), len(jobs), dict(counts))
  return sorted(trees, key=lambda t: t.tokens_T.tobytes())


def _demonstrator_backend(cfg) -> ScriptedBackend:
  template = chat_template(cfg.model)
  policy = check_demonstrator(cfg.sft)(template, **cfg.sft.demonstrator_args)
  return ScriptedBackend(template, policy)


def run_sft(policy, trees: list[CallTree], config: SFTConfig, learner_config: LearnerConfig, metrics: Metrics,
            seed: int):
  """`config.steps` cross-entropy updates on the demonstration trees, epoch after epoch of length-binned
  packed batches of `rows` x `row_len` (the SFT stage's loop); returns the trained policy module."""
  # The demonstrations' cross-entropy is a token mean: the RL loss's options and per-rollout aggregations
  # are not its. They were not sampled by the policy: no routes to replay.
  sft_cfg = dataclasses.replace(learner_config, loss="sft", loss_kwargs={}, normalisation=None,
                                aggregation="paths" if learner_config.aggregation == "paths" else "token",
                                lr=config.lr, kl_coef=0.0, warmup_steps=0,
                                micro_batches=1, epochs=1, minibatches=1, shuffle=False, routing_replay="off",
                                value=dataclasses.replace(learner_config.value, kind="none"))
  refuse_trees(trees, policy.cfg.vocab_size)
  learner = Learner(sft_cfg, policy)
  plan = make_plan([t.size for t in trees], row_len=config.row_len, rows=config.rows,
                   pool_batches=config.pool_batches, seed=seed, epochs=None, steps=config.steps)
  fit(learner, trees, plan, row_len=config.row_len, rows=config.rows, metrics=metrics)
  return learner.policy_model()
