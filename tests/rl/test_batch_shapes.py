"""Laying out rows and equalising batch shapes across processes: the row layout, the agreed shapes, padding
into a larger shape, batches of empty rows, and a learner step unchanged by the padding (the 2-process
run is tests/test_distributed.py)."""
from __future__ import annotations

import numpy as np
import pytest

from clawjax.rl.config import LearnerConfig
from clawjax.rl.device_batch import (BatchShape, GlobalShape, RowLayout, agree_shapes, batch_shape, empty_batch,
                                     prepare_batch, process_share)
from clawjax.rl.learner import Learner
from tests.rl.learner_batches import TINY, make_policy, random_tree, rel_diff, stack_rows, tree_layout

TOL = 1e-5


def _batch(seed: int, n: int = 3, rows: int = 3, length: int = 64):
  rng = np.random.default_rng(seed)
  return tree_layout([random_tree(rng, 30, TINY.vocab_size) for _ in range(n)], rows=rows, length=length)


def test_agreed_shapes_take_every_process_rows_and_the_largest_sizes_batch_by_batch():
  a0, a1, b0 = BatchShape(8, 96, 32), BatchShape(4, 96, 64), BatchShape(12, 64, 32)
  assert agree_shapes([[a0, a1], [b0]]) == [GlobalShape((8, 12), 96, 32), GlobalShape((4, 0), 96, 64)]
  assert agree_shapes([[], [b0], []]) == [GlobalShape((0, 12, 0), 64, 32)]
  assert agree_shapes([[], []]) == []


def test_batch_shape_is_the_batch_own_rows_and_its_loss_slots():
  b = _batch(0, rows=3)
  shape = batch_shape(b, chunk=16)
  most = int((b.unique_weight_RT > 0).sum(axis=1).max())
  assert shape == BatchShape(3, 64, -(-most // 16) * 16)


def test_row_layout_splits_each_process_rows_over_the_minibatches_then_pads():
  # One process, 5 rows, 2 minibatches: rows 0-2 and 3-4, whatever the micro-batches.
  for micro in (2, 4):
    slots = RowLayout((5,), minibatches=2, micro_batches=micro).slots(0)
    half = micro // 2
    assert sorted(slots[:half][slots[:half] >= 0]) == [0, 1, 2] and sorted(slots[half:][slots[half:] >= 0]) == [3, 4]
  # Two processes of 4 rows, 2 row shards each: minibatch k is every process's k-th half; the global
  # order is minibatch by minibatch, process by process (the one-process order of 8 rows).
  layout = RowLayout((4, 4), minibatches=2, micro_batches=2, local_shards=2)
  assert [o.tolist() for o in layout.order()] == [[0, 1, 4, 5], [2, 3, 6, 7]]
  np.testing.assert_array_equal(layout.slots(1), [[0, 1], [2, 3]])
  # Unequal processes: slots for the larger, empty rows (-1) for the other.
  layout = RowLayout((6, 2), micro_batches=2, local_shards=2)
  np.testing.assert_array_equal(layout.slots(0), [[0, 1, 4, 5], [2, 3, -1, -1]])
  np.testing.assert_array_equal(layout.slots(1), [[0, 1, -1, -1], [-1, -1, -1, -1]])
  assert [process_share(5, 2, p) for p in (0, 1)] == [3, 2]
  with pytest.raises(ValueError, match="2 processes"):
    process_share(1, 2, 0)


def test_prepare_into_a_larger_shape_adds_only_empty_rows_and_positions():
  b = _batch(1, rows=3)
  kw = dict(aggregation="token", chunk=16)
  small = prepare_batch(b, RowLayout((3,), micro_batches=2), **kw)
  big_layout = RowLayout((3,), micro_batches=2, local_shards=4)
  big = prepare_batch(b, big_layout, length=80, loss_slots=64, **kw)
  flat = lambda x: np.asarray(x).reshape(-1, *np.asarray(x).shape[2:])
  rows, length, k = 3, 64, flat(small.weight).shape[1]
  pick = lambda d: np.argsort(np.where(flat(d.row_order) >= 0, flat(d.row_order), 1 << 20))[:rows]
  s_rows, b_rows = pick(small), pick(big)
  for name in ("tokens", "positions", "segment_ids", "subtree_end"):
    np.testing.assert_array_equal(flat(getattr(big, name))[b_rows, :length], flat(getattr(small, name))[s_rows], name)
  for name in ("pred_index", "targets", "weight", "logp_rollout", "advantages", "returns"):
    np.testing.assert_array_equal(flat(getattr(big, name))[b_rows, :k], flat(getattr(small, name))[s_rows], name)
    assert not flat(getattr(big, name))[:, k:].any() and not np.delete(flat(getattr(big, name)), b_rows, 0).any(), name
  assert not flat(big.segment_ids)[:, length:].any()
  np.testing.assert_array_equal(flat(big.subtree_end)[:, length:], np.broadcast_to(np.arange(65, 81), (8, 16)))
  assert big.tokens.shape == (2, 4, 80) and big.weight.shape == (2, 4, 64) and big.row_order.shape == (2, 4)
  empty = empty_batch(RowLayout((0, 3), micro_batches=2, local_shards=4), 0, length=80, loss_slots=64)
  assert empty.tokens.shape == big.tokens.shape and not np.asarray(empty.weight).any()
  assert (np.asarray(empty.row_order) == -1).all()
  with pytest.raises(ValueError, match="does not fit"):
    prepare_batch(b, RowLayout((2,)), **kw)
  with pytest.raises(ValueError, match="does not fit"):
    prepare_batch(b, RowLayout((3,)), length=32, **kw)


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
