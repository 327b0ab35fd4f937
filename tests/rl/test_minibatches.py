"""Which rows an update sees: minibatches independent of the memory and mesh settings, a minibatch without
loss tokens not an update, and pi_old the policy the RL step started from for all of its batches."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from clawjax import sharding
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.train.step_data import StepData
from clawjax.train.steps import update
from tests.rl.learner_batches import TINY, make_policy, random_tree, rel_diff, stack_rows, tree_layout

# Plain SGD with a step large enough to move pi / pi_old out of the clip range: params differ wherever
# the updates saw other rows.
SGD = LearnerConfig(optimizer="sgd", lr=0.5, grad_clip=None, logits_chunk=32, c_bar=1.5)


def _batch(seed: int, rows: int):
  rng = np.random.default_rng(seed)
  return tree_layout([random_tree(rng, 30, TINY.vocab_size) for _ in range(rows)], rows=rows, length=32)


def _delta(learner: Learner) -> dict:
  """The policy's params minus the initial ones (far smaller than the params: a sharp comparison)."""
  start = jax.device_get(Learner(learner.cfg, make_policy()).state.params["policy"])
  return jax.tree.map(lambda a, b: np.asarray(a, np.float64) - b, jax.device_get(learner.state.params["policy"]), start)


@pytest.mark.parametrize("epochs,shuffle", [(1, False), pytest.param(2, True, marks=pytest.mark.slow)])
def test_micro_batches_and_row_shards_do_not_change_the_minibatches(epochs, shuffle):
  """6 rows in 2 minibatches are rows 0-2 and 3-5 (or a shuffled deal of them) whether the rows are cut into
  2 or 4 micro-batches or split over 2 row shards; before, the rows were padded to a multiple of
  micro-batches x row shards first (8 with 4 micro-batches: minibatches of rows 0-3 and 4-5)."""
  batch = _batch(0, rows=6)
  runs = {}
  for micro, data in ((2, 1), (4, 1), (2, 2))[:3 if shuffle else 2]:
    # Seed 5: the deal of the former shuffle (a permutation of the padded rows) changed with the padding.
    cfg = dataclasses.replace(SGD, epochs=epochs, minibatches=2, shuffle=shuffle, micro_batches=micro, seed=5)
    mesh = sharding.make_mesh(sharding.MeshConfig(data=data), jax.devices()[:data])
    learner = Learner(cfg, make_policy(), mesh=mesh)
    m = learner.step(batch)
    assert m["updates"] == 2 * epochs
    runs[micro, data] = _delta(learner)
  for other in list(runs)[1:]:
    assert rel_diff(runs[other], runs[2, 1]) < 1e-5, other


def test_a_minibatch_without_loss_tokens_is_not_an_update():
  """AdamW with weight decay on 2 rows in 2 minibatches, the second row empty: one update, the very one
  of the first row alone (before, the empty minibatch stepped AdamW: moments and decay moved the params)."""
  rows = _batch(1, rows=1)
  with_empty = stack_rows([(rows, 0), None], length=32)
  cfg = LearnerConfig(lr=1e-3, weight_decay=0.1, logits_chunk=32)
  alone = Learner(cfg, make_policy())
  split = Learner(dataclasses.replace(cfg, micro_batches=2, minibatches=2), make_policy())
  m_alone, m_split = alone.step(rows), split.step(with_empty)
  assert m_split["updates"] == m_alone["updates"] == 1 and m_split["skipped_updates"] == 0
  assert int(split.state.step) == 1
  assert m_split["grad_norm"] == pytest.approx(m_alone["grad_norm"], rel=1e-6)
  state = lambda learner: jax.device_get((learner.state.params, learner.state.opt_state))
  assert rel_diff(state(split), state(alone)) < 1e-6
  # A batch with no loss token at all makes no update.
  before = jax.device_get(split.state)
  m = split.step(stack_rows([None, None], length=32))
  assert m["updates"] == 0 and m["skipped_updates"] == 0 and int(split.state.step) == 1
  for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(split.state))):
    if x.dtype != np.uint32:  # all but the RNG, which every step advances
      np.testing.assert_array_equal(x, y)


def test_pi_old_is_the_policy_the_step_started_from_for_every_batch():
  """A step of two packed batches: both measure pi / pi_old against the params before the first update, so
  the step equals one learner step with 2 minibatches over their rows (pi_old frozen before the first
  update). Before, the second batch's pi_old was taken after the first update (ratio 1: never clipped)."""
  first, second = _batch(2, rows=2), _batch(3, rows=2)
  data = StepData(batches=[first, second], scores=None, counts={}, rewards={}, groups={}, tree_stats={})
  stepped = Learner(SGD, make_policy())
  m = update(stepped, data, value_pretrain_steps=0)
  both = stack_rows([(first, 0), (first, 1), (second, 0), (second, 1)], length=32)
  minibatched = Learner(dataclasses.replace(SGD, micro_batches=2, minibatches=2), make_policy())
  m_mb = minibatched.step(both)
  assert m["updates"] == m_mb["updates"] == 2
  assert rel_diff(_delta(stepped), _delta(minibatched)) < 1e-5
  assert m_mb["clip_fraction"] > 0  # the second update's ratio has moved off 1: the clip binds
