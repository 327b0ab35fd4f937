"""Packed batches: attention and prediction rules checked by brute force; tree and paths layouts agree."""

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from clawjax.calllog import RolloutRecord
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import first_fit, pack_paths, pack_trees, split_for_rows

from tests.tree.reference import ancestor_matrix, context_of, make_call, rollouts

SETTINGS = settings(max_examples=25, deadline=None)


@st.composite
def kept_trees(draw):
  """1-4 filtered rollouts (small vocabulary: many merges and branches) with random rewards."""
  trees, outcomes = [], []
  for i, calls in enumerate(draw(st.lists(rollouts(vocab_size=20, max_calls=6), min_size=1, max_size=4))):
    rid = f"r{i}"
    trees.append(filter_rollout(rid, calls).tree)
    outcomes.append(RolloutRecord(rid, "task", "h", draw(st.floats(0, 1)), "ok"))
  return trees, grpo_advantages(outcomes)


def row_relations(batch, r):
  """(attention rule matrix, brute-force ancestor-or-self within segment) of row r."""
  seg = batch.segment_ids_RT[r]
  idx = np.arange(batch.shape[1])
  rule = ((seg[:, None] == seg[None, :]) & (seg[:, None] > 0) & (idx[None, :] <= idx[:, None])
          & (idx[:, None] < batch.subtree_end_RT[r][None, :]))
  anc = ancestor_matrix(batch.parent_index_RT[r]) & (seg[:, None] > 0)
  return rule, anc


def check_layout(batch):
  for r in range(batch.shape[0]):
    rule, anc = row_relations(batch, r)
    assert (rule == anc).all()
    par = batch.parent_index_RT[r]
    real = batch.segment_ids_RT[r] > 0
    has_parent = par >= 0
    assert (batch.positions_RT[r][has_parent] == batch.positions_RT[r][par[has_parent]] + 1).all()
    assert (batch.positions_RT[r][real & ~has_parent] == 0).all()
    assert (batch.segment_ids_RT[r][par[has_parent]] == batch.segment_ids_RT[r][has_parent]).all()
  pad = batch.segment_ids_RT == 0
  assert not batch.loss_mask_RT()[pad].any() and (batch.rollout_index_RT[pad] == -1).all()
  assert not (batch.loss_mask_RT() & (batch.parent_index_RT < 0)).any()


def loss_events(batch, weight_RT):
  """Multiset of (rollout, context, target, advantage, rollout log-prob) with multiplicity = weight."""
  out = collections.Counter()
  for r, i in zip(*np.nonzero(weight_RT)):
    key = (batch.rollout_ids_N[batch.rollout_index_RT[r, i]],
           context_of(batch.tokens_RT[r], batch.parent_index_RT[r], i), int(batch.tokens_RT[r, i]),
           float(batch.advantages_RT[r, i]), float(batch.rollout_logprobs_RT[r, i]))
    out[key] += float(weight_RT[r, i])
  return out


@given(kept_trees())
@SETTINGS
def test_tree_and_paths_layouts_agree(trees_scores):
  trees, scores = trees_scores
  row_len = max([256] + [t.size for t in trees])
  tree_b = pack_trees(trees, scores, row_len=row_len)
  path_b = pack_paths(trees, scores, row_len=row_len)
  check_layout(tree_b)
  check_layout(path_b)
  assert int((tree_b.segment_ids_RT > 0).sum()) == sum(t.size for t in trees)
  assert int((path_b.segment_ids_RT > 0).sum()) == sum(t.path_tokens() for t in trees)
  for w in ("unique_weight_RT", "path_weight_RT"):
    assert loss_events(tree_b, getattr(tree_b, w)) == loss_events(path_b, getattr(path_b, w))
    assert getattr(tree_b, w).sum() == getattr(path_b, w).sum()
  # Each sampled token of a rollout enters the unique weighting once, and only sampled tokens do.
  assert tree_b.unique_weight_RT.sum() == sum(int((t.owner_T >= 0).sum()) for t in trees)
  # Per-rollout tables.
  for b in (tree_b, path_b):
    index = scores.index()
    for n, rid in enumerate(b.rollout_ids_N):
      assert b.rewards_N[n] == scores.rewards_N[index[rid]]
      mask = (b.rollout_index_RT == n) & b.loss_mask_RT()
      assert (b.advantages_RT[mask] == scores.advantages_N[index[rid]]).all()
      assert (b.returns_RT[mask] == scores.rewards_N[index[rid]]).all()


def test_tree_larger_than_a_row_is_a_clear_error():
  trees, scores = _two_trees()
  with pytest.raises(ValueError, match=r"rollout 'a'.*exceeds row_len=8"):
    pack_trees(trees, scores, row_len=8)
  with pytest.raises(ValueError, match="need 2 rows"):
    pack_trees(trees, scores, row_len=trees[0].size, rows=1)
  with pytest.raises(ValueError, match="no score"):
    pack_trees(trees, grpo_advantages([]), row_len=64)
  fixed = pack_trees(trees, scores, row_len=64, rows=3)  # static shape: padding rows
  assert fixed.shape == (3, 64) and (fixed.segment_ids_RT[1:] == 0).all()
  assert fixed.segment_ids_RT[0].max() == 2
  batches = split_for_rows(trees, row_len=trees[0].size, rows=1)
  assert [[t.rollout_id for t in b] for b in batches] == [["a"], ["b"]]
  for b in batches:
    assert pack_trees(b, scores, row_len=trees[0].size, rows=1).shape == (1, trees[0].size)


def test_a_negative_segment_id_is_refused():
  """Segment ids are 1, 2, ... and 0 for padding: a batch that carries a negative one says where."""
  trees, scores = _two_trees()
  b = pack_trees(trees, scores, row_len=64)
  seg = b.segment_ids_RT.copy()
  seg[0, 3] = -1
  with pytest.raises(ValueError, match=r"^PackedBatch.segment_ids_RT: negative segment id -1 at row 0, position 3 "):
    dataclasses.replace(b, segment_ids_RT=seg)


def test_first_fit_decreasing_matches_brute_force_bins():
  sizes = [5, 3, 7, 2, 4, 1]
  rows = first_fit(sizes, 8)
  fill = collections.Counter()
  for s, r in zip(sizes, rows):
    fill[r] += s
  assert max(fill.values()) <= 8 and len(fill) == 3  # 22 tokens: 3 rows of 8 is optimal


def _two_trees():
  calls = [make_call(0, [1, 2, 3, 4, 5, 6], [7, 8, 9, 10])]
  trees = [filter_rollout(rid, calls).tree for rid in ("a", "b")]
  scores = grpo_advantages([RolloutRecord("a", "t", "h", 1.0, "ok"),
                            RolloutRecord("b", "t", "h", 0.0, "ok")])
  return trees, scores
