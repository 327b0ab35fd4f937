"""Equalising batch shapes across processes: the agreed shapes, padding into a larger shape, batches of
empty rows, and a learner step unchanged by the padding (the 2-process run is tests/test_distributed.py)."""
from __future__ import annotations

import numpy as np
import pytest

from clawjax.rl.config import LearnerConfig
from clawjax.rl.device_batch import BatchShape, agree_shapes, batch_shape, empty_batch, prepare_batch
from clawjax.rl.learner import Learner
from tests.rl.learner_batches import TINY, make_policy, random_tree, rel_diff, stack_rows, tree_layout

TOL = 1e-5


def _batch(seed: int, n: int = 3, rows: int = 3, length: int = 64):
  rng = np.random.default_rng(seed)
  return tree_layout([random_tree(rng, 30, TINY.vocab_size) for _ in range(n)], rows=rows, length=length)


def test_agreed_shapes_take_the_largest_of_every_dimension_batch_by_batch():
  a0, a1, b0 = BatchShape(8, 96, 32), BatchShape(4, 96, 64), BatchShape(12, 64, 32)
  assert agree_shapes([[a0, a1], [b0]]) == [BatchShape(12, 96, 32), a1]
  assert agree_shapes([[], [b0], []]) == [b0]
  assert agree_shapes([[], []]) == []


def test_batch_shape_rounds_rows_to_micro_batches_times_row_shards():
  b = _batch(0, rows=3)
  shape = batch_shape(b, normalisation="unique", micro_batches=2, row_multiple=2, chunk=16)
  most = int((b.unique_weight_RT > 0).sum(axis=1).max())
  assert shape == BatchShape(4, 64, -(-most // 16) * 16)


def test_prepare_into_a_larger_shape_adds_only_empty_rows_and_positions():
  b = _batch(1, rows=3)
  kw = dict(normalisation="unique", micro_batches=2, row_multiple=1, chunk=16)
  small = prepare_batch(b, **kw)
  big_shape = BatchShape(8, 80, 64)
  big = prepare_batch(b, shape=big_shape, **kw)
  flat = lambda x: np.asarray(x).reshape(-1, *np.asarray(x).shape[2:])
  rows, length, k = flat(small.tokens).shape[0], 64, flat(small.weight).shape[1]
  for name in ("tokens", "positions", "segment_ids", "subtree_end"):
    np.testing.assert_array_equal(flat(getattr(big, name))[:rows, :length], flat(getattr(small, name))[:rows], name)
  for name in ("pred_index", "targets", "weight", "logp_rollout", "advantages", "returns"):
    np.testing.assert_array_equal(flat(getattr(big, name))[:rows, :k], flat(getattr(small, name))[:rows], name)
    assert not flat(getattr(big, name))[:, k:].any() and not flat(getattr(big, name))[rows:].any(), name
  assert not flat(big.segment_ids)[:, length:].any()
  np.testing.assert_array_equal(flat(big.subtree_end)[:, length:], np.broadcast_to(np.arange(65, 81), (8, 16)))
  assert big.tokens.shape == (2, 4, 80) and big.weight.shape == (2, 4, 64)
  empty = empty_batch(big_shape, micro_batches=2)
  assert empty.tokens.shape == big.tokens.shape and not np.asarray(empty.weight).any()
  with pytest.raises(ValueError, match="does not fit"):
    prepare_batch(b, shape=BatchShape(2, 64, 64), **kw)
  with pytest.raises(ValueError, match="does not fit"):
    prepare_batch(b, shape=BatchShape(4, 32, 64), **kw)


def test_prepare_all_shares_loss_slots_and_padding_leaves_the_step_unchanged():
  learner = Learner(LearnerConfig(logits_chunk=16, micro_batches=2, c_bar=1.5), make_policy())
  a, b = _batch(2, n=2, rows=2), _batch(3, n=6, rows=3)
  prepared = learner.prepare_all([a, b])
  assert len(prepared) == 2 and prepared[0].weight.shape[-1] == prepared[1].weight.shape[-1] >= 16
  assert learner.prepare_all([]) == []
  # The same rows with an empty row among them, in the shape the plain batch is padded to (one compile).
  padded = stack_rows([(b, 0), None, (b, 1), (b, 2)], length=64)
  loss, grads, metrics = learner.loss_and_grads(b)
  loss_p, grads_p, metrics_p = learner.loss_and_grads(padded)
  assert loss_p == pytest.approx(loss, rel=TOL)
  assert rel_diff(grads_p, grads) < TOL
  assert metrics_p["tokens"] == metrics["tokens"]
