"""Several optimizer updates per batch (LearnerConfig.epochs / minibatches / shuffle) against an
independent reference: plain SGD on the clipped GRPO objective (Eqs. 1, 4) written out here from
full-vocab logits of the whole packed batch, with log pi_old frozen at the initial params."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.config import ConfigError
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.tasks import bundled_tasks_dir
from clawjax.train.config import train_config
from clawjax.tree.batch import PackedBatch
from tests.rl.learner_batches import TINY, make_policy, random_tree, rel_diff, tree_layout

ROWS = 4
# Plain SGD so that the reference is p - lr * g; a step this large moves pi/pi_old out of the clip range.
# Seed 12: the shuffled deal of the 4 rows differs from the plain one, and between the two epochs.
BASE = LearnerConfig(optimizer="sgd", lr=0.5, grad_clip=None, micro_batches=2, logits_chunk=32, c_bar=1.5, seed=12)


def _batch() -> PackedBatch:
  rng = np.random.default_rng(11)
  return tree_layout([random_tree(rng, 40, TINY.vocab_size) for _ in range(ROWS)], rows=ROWS, length=48)


class Reference:
  """SGD updates of make_policy()'s params, each on the loss tokens of a set of rows, normalised by that
  set's own weight sum; also the weighted loss and clip fraction each update saw."""

  def __init__(self, batch: PackedBatch, cfg: LearnerConfig):
    self.graphdef, self.params, self.rest = nnx.split(make_policy(), nnx.Param, ...)
    self.cfg = cfg
    self.r, t = np.nonzero(batch.unique_weight_RT)
    self.w = batch.unique_weight_RT[self.r, t]
    pred, target = batch.parent_index_RT[self.r, t], batch.tokens_RT[self.r, t]
    arrays = (batch.tokens_RT, batch.positions_RT, batch.segment_ids_RT, batch.subtree_end_RT)

    def logp(params):
      logits = nnx.merge(self.graphdef, params, self.rest)(*arrays)
      return jax.nn.log_softmax(logits / cfg.temperature)[self.r, pred, target]

    logp_old = jax.jit(logp)(self.params)
    tis = jnp.minimum(jnp.exp(logp_old - batch.rollout_logprobs_RT[self.r, t]), cfg.c_bar)
    adv = batch.advantages_RT[self.r, t]

    def objective(params, w_sel):
      ratio = jnp.exp(logp(params) - logp_old)
      unclipped, clipped = ratio * adv, jnp.clip(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv
      norm = jnp.sum(w_sel)
      clip_fraction = jnp.sum(w_sel * (clipped < unclipped)) / norm
      return jnp.sum(w_sel * tis * -jnp.minimum(unclipped, clipped)) / norm, clip_fraction

    self.grad = jax.jit(jax.value_and_grad(objective, has_aux=True))

  def run(self, order: list[list[np.ndarray]]) -> tuple[nnx.State, list[list[dict[str, float]]]]:
    """`order`: per epoch, the row sets of its updates. Returns the params and per-update stats."""
    params, stats = self.params, []
    for epoch in order:
      stats.append([])
      for rows in epoch:
        w_sel = np.where(np.isin(self.r, rows), self.w, 0).astype(np.float32)
        (loss, clip_fraction), grads = self.grad(params, w_sel)
        params = jax.tree.map(lambda p, g: p - self.cfg.lr * g, params, grads)
        stats[-1].append({"loss": float(loss), "clip_fraction": float(clip_fraction),
                          "share": float(w_sel.sum() / self.w.sum())})
    return params, stats


@pytest.fixture(scope="module")
def reference():
  batch = _batch()
  return batch, Reference(batch, BASE)


def _order(cfg: LearnerConfig) -> list[list[np.ndarray]]:
  """Row sets per update: consecutive rows, or each epoch's documented deal (the rows sorted by
  uniform(fold_in(epoch key, row)), epoch key fold_in(step key, epochs x minibatches + epoch), step key =
  split(train-state rng)[1])."""
  n = cfg.epochs * cfg.minibatches
  _, step_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
  order = []
  for e in range(cfg.epochs):
    rows = np.arange(ROWS)
    if cfg.shuffle:
      key = jax.random.fold_in(step_key, n + e)
      rows = np.argsort([float(jax.random.uniform(jax.random.fold_in(key, r))) for r in range(ROWS)])
    order.append(np.split(rows, cfg.minibatches))
  return order


@pytest.mark.parametrize("epochs,minibatches,shuffle", [(1, 1, False), (2, 1, False), (1, 2, False), (2, 2, True)])
def test_updates_equal_sequential_reference_updates(reference, epochs, minibatches, shuffle):
  batch, ref = reference
  cfg = dataclasses.replace(BASE, epochs=epochs, minibatches=minibatches, shuffle=shuffle)
  order = _order(cfg)
  expected, stats = ref.run(order)
  start = jax.tree.map(np.asarray, ref.params)
  learner = Learner(cfg, make_policy())
  m = learner.step(batch)
  got = learner.state.params["policy"]
  assert rel_diff(got, expected) < 1e-6
  if shuffle:  # the plain deal would give different params
    partitions = [{frozenset(mb.tolist()) for mb in epoch} for epoch in order]
    assert partitions[0] != partitions[1] and {frozenset({0, 1}), frozenset({2, 3})} not in partitions
    assert rel_diff(got, ref.run(_order(dataclasses.replace(cfg, shuffle=False)))[0]) > 1e-4
  # The updates themselves (params minus start), far smaller than the params: a sharper check.
  delta = lambda p: jax.tree.map(lambda a, b: np.asarray(a) - b, p, start)
  assert rel_diff(delta(got), delta(expected)) < 1e-5
  assert m["updates"] == epochs * minibatches and int(learner.state.step) == epochs * minibatches
  # Per-step metrics: the first epoch's weighted means, and the last epoch's with `_last`.
  epoch_mean = lambda e, k: sum(s["share"] * s[k] for s in stats[e])
  # Losses are sums of cancelling terms of size ~1 (advantage x ratio): an absolute tolerance.
  assert m["loss"] == pytest.approx(epoch_mean(0, "loss"), abs=1e-6)
  assert m["clip_fraction"] == pytest.approx(epoch_mean(0, "clip_fraction"), abs=1e-6)
  if minibatches == 1:
    assert m["clip_fraction"] == 0.0  # the first update sees ratio 1
  if epochs > 1:
    assert m["loss_last"] == pytest.approx(epoch_mean(-1, "loss"), abs=1e-6)
    assert m["clip_fraction_last"] == pytest.approx(epoch_mean(-1, "clip_fraction"), abs=1e-6)
    assert m["clip_fraction_last"] > 0.05 and m["approx_kl_last"] > 0  # pi / pi_old moved away from 1
  else:
    assert "loss_last" not in m


def test_bad_minibatches_are_clear_errors():
  with pytest.raises(ValueError, match="minibatches=3 must divide micro_batches=4"):
    LearnerConfig(micro_batches=4, minibatches=3)
  with pytest.raises(ValueError, match="epochs=0"):
    LearnerConfig(epochs=0)
  with pytest.raises(ConfigError, match="config.learner: .*minibatches=2 must divide micro_batches=1"):
    train_config({"tasks": str(bundled_tasks_dir()), "harnesses": ["mini"], "learner": {"minibatches": 2}})
  cfg = train_config({"tasks": str(bundled_tasks_dir()), "harnesses": ["mini"],
                      "learner": {"epochs": 3, "minibatches": 2, "micro_batches": 4, "shuffle": True}})
  assert (cfg.learner.epochs, cfg.learner.minibatches, cfg.learner.shuffle) == (3, 2, True)
