"""The SFT update loop, on the RL learner: the `sft` loss (token cross-entropy, clawjax.rl.losses) over
length-binned packed batches, one optimizer update per batch.

  plan = make_plan([t.size for t in trees], row_len=..., rows=..., pool_batches=..., seed=..., epochs=3)
  learner = Learner(sft_learner_config, policy, mesh=mesh, policy_schedule=lr_schedule(...))
  fit(learner, trees, plan, row_len=..., rows=..., metrics=writer, heldout=heldout_batches)

Per update, `metrics.write("sft", step, ...)`: nll (the token-mean cross-entropy of the batch, before
the update), grad_norm, lr, tokens_per_s (non-padding tokens per second of the update), padding_fraction,
loss_tokens, conversations, epoch, skipped_updates; with held-out batches, heldout_nll at step 0 (before
training), every `eval_every` updates and after the last. A run resumes at any step: the plan is fixed
by the seed, and `on_step` is where the caller checkpoints.

In a run of several processes (clawjax.distributed) every process makes the same plan and calls `fit`
with the same trees; each packs and feeds only its share of an update's rows (the learner's
`process_rows`), the normaliser is the weight sum over every process's rows, so an update equals the
one-process update on the same rows. The metrics are the global batch's on every process.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import jax
import optax
import tqdm

from clawjax.rl.learner import Learner
from clawjax.sft.packing import BatchPlan, pack, plan_epoch
from clawjax.tree.batch import PackedBatch
from clawjax.tree.build import CallTree

log = logging.getLogger(__name__)

PHASE = "sft"


class Metrics(Protocol):
  """Where the loop writes (clawjax.train.metrics.MetricsWriter)."""

  def write(self, phase: str, step: int, metrics: Mapping[str, float]) -> None:
    ...


@dataclasses.dataclass(frozen=True)
class Step:
  epoch: int
  batch: BatchPlan


def make_plan(sizes: Sequence[int], *, row_len: int, rows: int, pool_batches: int, seed: int,
              epochs: int | None, steps: int = 0) -> list[Step]:
  """Every update of the run: `epochs` epochs (None: as many as `steps` needs), cut at `steps` if > 0."""
  if not len(sizes):
    raise ValueError("no training data: every source was empty or left out (see the counts)")
  if epochs is None and not steps:
    raise ValueError("make_plan: give epochs, steps or both")
  plan: list[Step] = []
  epoch = 0
  while (epochs is None or epoch < epochs) and not (steps and len(plan) >= steps):
    plan += [Step(epoch, b) for b in plan_epoch(sizes, row_len=row_len, rows=rows, pool_batches=pool_batches,
                                                seed=seed, epoch=epoch)]
    epoch += 1
  return plan[:steps] if steps else plan


def lr_schedule(lr: float, updates: int, warmup_ratio: float, min_lr_ratio: float) -> optax.Schedule:
  """Linear warm-up from 0 over ceil(warmup_ratio x updates), then a cosine decay to min_lr_ratio x lr at
  the last update (transformers' `cosine_with_min_lr`, OpenRLHF's SFT schedule)."""
  warmup = math.ceil(updates * warmup_ratio)
  return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(updates, warmup + 1), end_value=lr * min_lr_ratio)


def heldout_batches(learner: Learner, trees: Sequence[CallTree], *, row_len: int, rows: int) -> list[PackedBatch]:
  """The held-out set packed once, in order, in batches of `rows` rows (this process's share of them)."""
  plans = plan_epoch([t.size for t in trees], row_len=row_len, rows=rows, pool_batches=1 << 20, seed=0,
                     epoch=0, shuffle=False)
  return [pack(trees, p, row_len=row_len, rows=learner.process_rows(rows)) for p in plans]


def heldout_nll(learner: Learner, batches: Sequence[PackedBatch]) -> float:
  """The token-mean cross-entropy over every held-out batch, at the learner's current weights (a forward
  pass; every process calls it, with its share of the batches)."""
  total = weight = 0.0
  for b in batches:
    m = learner.loss(b)
    total, weight = total + m["loss"] * m["loss_weight"], weight + m["loss_weight"]
  return total / max(weight, 1.0)


def fit(learner: Learner, trees: Sequence[CallTree], plan: Sequence[Step], *, row_len: int, rows: int,
        metrics: Metrics, start: int = 0, heldout: Sequence[PackedBatch] = (), eval_every: int = 0,
        schedule: optax.Schedule | None = None, on_step: Callable[[int], None] | None = None,
        progress: bool = False) -> dict[str, float]:
  """Runs the updates start+1 .. len(plan); returns the last update's metrics."""
  last: dict[str, float] = {}
  fed = learner.process_rows(rows)
  if heldout and start == 0:
    metrics.write(PHASE, 0, {"heldout_nll": heldout_nll(learner, heldout)})
  with tqdm.tqdm(total=len(plan), initial=start, desc="SFT", unit="update", disable=not progress) as bar:
    for step in range(start + 1, len(plan) + 1):
      item = plan[step - 1]
      lr = float(schedule(int(jax.device_get(learner.state.step)))) if schedule is not None else learner.cfg.lr
      m = learner.step(pack(trees, item.batch, row_len=row_len, rows=fed))
      # Of the global batch (m["tokens"]: its non-padding tokens, over every process's rows).
      last = {"nll": m["nll"], "grad_norm": m["grad_norm"], "lr": lr, "tokens_per_s": m["tokens_per_s"],
              "padding_fraction": 1.0 - m["tokens"] / (rows * row_len),
              "loss_tokens": float(sum(trees[i].loss_tokens for i in item.batch.trees)),
              "conversations": float(len(item.batch.trees)), "epoch": float(item.epoch),
              "step_seconds": m["step_seconds"], "skipped_updates": m["skipped_updates"]}
      if heldout and ((eval_every and step % eval_every == 0) or step == len(plan)):
        last["heldout_nll"] = heldout_nll(learner, heldout)
      metrics.write(PHASE, step, last)
      if on_step is not None:
        on_step(step)
      bar.update(1)
      bar.set_postfix(nll=f"{m['nll']:.3f}")
      if step % 10 == 0 or step == len(plan):
        log.info("SFT update %d/%d (epoch %d): nll %.4f%s", step, len(plan), item.epoch, m["nll"],
                 f", held-out {last['heldout_nll']:.4f}" if "heldout_nll" in last else "")
  return last
