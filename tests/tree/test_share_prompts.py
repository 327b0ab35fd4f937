"""Prompt sharing in the tree layout: a GRPO group's common task prompt is packed once.

The reference is the paths layout (every root-to-leaf path a plain causal sequence): per trained token,
the token sequence the attention rule lets it see must be the same path prefix in both, with the same
weights, advantage and log-prob. The expected saving comes from an independent count: the common
prefix of every root-to-leaf path of every rollout in the group, cut before the first sampled token.
"""

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from clawjax.calllog import RolloutRecord
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_paths, pack_trees, split_for_rows

from tests.tree.reference import make_call
from tests.tree.test_tree_pack import check_layout, row_relations

SETTINGS = settings(max_examples=40, deadline=None)


def _trees(calls):
  by: dict[str, list] = {}
  for c in calls:
    by.setdefault(c.rollout_id, []).append(c)
  return [filter_rollout(rid, cs).tree for rid, cs in by.items()]


@st.composite
def groups(draw):
  """1-3 GRPO groups of 1-4 small agent rollouts each; two groups may have the very same prompt. Four
  content tokens: rollouts often sample the same first tokens, which must still not be shared."""
  calls, outcomes = [], []
  same_prompt_seed = draw(st.integers(0, 2**32 - 1))
  for g in range(draw(st.integers(1, 3))):
    seed = same_prompt_seed if draw(st.booleans()) else draw(st.integers(0, 2**32 - 1))
    patterns = tuple(p for p in synthetic.PATTERNS if draw(st.booleans()))
    c, o = synthetic.agent_group(
        np.random.default_rng(seed), task_id="t", harness=f"h{g}", n_rollouts=draw(st.integers(1, 4)),
        prompt_len=draw(st.integers(4, 30)), n_calls=draw(st.integers(1, 4)),
        tokens_per_call=draw(st.integers(8, 20)), patterns=patterns, vocab_size=20)
    calls += c
    outcomes += o
  return _trees(calls), grpo_advantages(outcomes)


def attention_events(batch, weight_RT):
  """Multiset of (rollout, tokens the attention rule lets it see incl. itself, advantage, return,
  rollout log-prob) over tokens with weight > 0, multiplicity = weight."""
  out = collections.Counter()
  for r in range(batch.shape[0]):
    rule, _ = row_relations(batch, r)
    for i in np.flatnonzero(weight_RT[r]):
      key = (batch.rollout_ids_N[batch.rollout_index_RT[r, i]], tuple(batch.tokens_RT[r][rule[i]].tolist()),
             float(batch.advantages_RT[r, i]), float(batch.returns_RT[r, i]),
             float(batch.rollout_logprobs_RT[r, i]))
      out[key] += float(weight_RT[r, i])
  return out


def seen_sequences(batch):
  """{(group, token sequence a real token sees)} over every real token."""
  out = set()
  for r in range(batch.shape[0]):
    rule, _ = row_relations(batch, r)
    for i in np.flatnonzero(batch.segment_ids_RT[r]):
      g = int(batch.group_ids_N[batch.rollout_index_RT[r, i]])
      out.add((g, tuple(batch.tokens_RT[r][rule[i]].tolist())))
  return out


def shareable_reference(t) -> int:
  """Common prefix of the tree's root-to-leaf paths, before the first sampled token."""
  paths = [t.path(int(leaf)) for leaf in t.leaves_L]
  n = 0
  while all(n < len(p) and t.tokens_T[p[n]] == t.tokens_T[paths[0][n]] for p in paths):
    n += 1
  return min([n] + [int(np.flatnonzero(t.owner_T[p] >= 0)[0]) for p in paths if (t.owner_T[p] >= 0).any()])


def saved_reference(trees, scores) -> int:
  """Tokens saved when every group fits one segment: (members - 1) x their common shareable prefix."""
  index = scores.index()
  by_group: dict[int, list] = collections.defaultdict(list)
  for t in trees:
    by_group[int(scores.group_ids_N[index[t.rollout_id]])].append(t)
  saved = 0
  for members in by_group.values():
    p = min(shareable_reference(t) for t in members)
    for t in members[1:]:
      p = min(p, next((k for k in range(p) if t.tokens_T[k] != members[0].tokens_T[k]), p))
    saved += (len(members) - 1) * p
  return saved


@given(groups(), st.integers(0, 60))
@SETTINGS
def test_shared_layout_matches_paths_layout(trees_scores, slack):
  trees, scores = trees_scores
  # From one tree per row up to whole groups per row: merging must respect row_len.
  row_len = max(t.size for t in trees) + slack
  shared = pack_trees(trees, scores, row_len=row_len, share_prompts=True)
  plain = pack_trees(trees, scores, row_len=row_len)
  paths = pack_paths(trees, scores, row_len=row_len)
  check_layout(shared)
  for w in ("unique_weight_RT", "path_weight_RT"):
    assert attention_events(shared, getattr(shared, w)) == attention_events(paths, getattr(paths, w))
  assert seen_sequences(shared) == seen_sequences(plain)
  assert sorted(shared.rollout_ids_N) == sorted(t.rollout_id for t in trees)
  index = scores.index()
  assert [scores.group_ids_N[index[rid]] for rid in shared.rollout_ids_N] == list(shared.group_ids_N)
  n_shared, n_plain = int((shared.segment_ids_RT > 0).sum()), int((plain.segment_ids_RT > 0).sum())
  assert n_shared <= n_plain
  big = pack_trees(trees, scores, row_len=sum(t.size for t in trees), share_prompts=True)
  assert int((big.segment_ids_RT > 0).sum()) == n_plain - saved_reference(trees, scores)
  for part in split_for_rows(trees, row_len=row_len, rows=2, scores=scores, share_prompts=True):
    pack_trees(part, scores, row_len=row_len, rows=2, share_prompts=True)  # fits the static shape


@given(groups())
@SETTINGS
def test_no_sampled_token_is_shared_and_groups_never_mix(trees_scores):
  trees, scores = trees_scores
  b = pack_trees(trees, scores, row_len=sum(t.size for t in trees), share_prompts=True)
  for r in range(b.shape[0]):
    rule, _ = row_relations(b, r)
    owner = b.rollout_index_RT[r]
    # A key seen by queries of more than one rollout is shared: it must be untrained context.
    seen_by = [set(owner[rule[:, j]].tolist()) for j in range(b.shape[1])]
    shared = np.array([len(s) > 1 for s in seen_by])
    assert not b.loss_mask_RT()[r][shared].any()
    assert (b.rollout_logprobs_RT[r][shared] == 0).all()
    for seg in set(b.segment_ids_RT[r].tolist()) - {0}:
      assert len(set(b.group_ids_N[owner[b.segment_ids_RT[r] == seg]].tolist())) == 1


@given(groups(), st.integers(0, 60))
@SETTINGS
def test_every_rollout_lies_in_one_row(trees_scores, slack):
  """Sequence-level losses reduce a rollout's tokens inside one row (clawjax.rl.losses.rollout_mean): the
  tree layout never splits a rollout, merged with its group or not, whatever the rows hold."""
  trees, scores = trees_scores
  row_len = max(t.size for t in trees) + slack
  for share in (True, False):
    b = pack_trees(trees, scores, row_len=row_len, share_prompts=share)
    rows_of = collections.defaultdict(set)
    for r, i in zip(*np.nonzero(b.loss_mask_RT())):
      rows_of[int(b.rollout_index_RT[r, i])].add(int(r))
    assert len(rows_of) == sum(t.loss_tokens > 0 for t in trees)
    assert all(len(rows) == 1 for rows in rows_of.values())


def test_identical_prompts_of_two_groups_are_not_merged():
  calls, outcomes = [], []
  for harness in ("a", "b"):  # same seed: the same prompt and calls under two harnesses
    c, o = synthetic.agent_group(np.random.default_rng(7), task_id="t", harness=harness, n_rollouts=3,
                                 prompt_len=40, n_calls=2, tokens_per_call=10, vocab_size=50)
    calls += c
    outcomes += o
  trees, scores = _trees(calls), grpo_advantages(outcomes)
  b = pack_trees(trees, scores, row_len=4096, share_prompts=True)
  assert b.segment_ids_RT.max() == 2  # one merged segment per group
  for seg in (1, 2):
    assert len(set(b.group_ids_N[b.rollout_index_RT[b.segment_ids_RT == seg]].tolist())) == 1
  saved = saved_reference(trees, scores)
  assert saved >= 2 * 2 * 40 and int((b.segment_ids_RT > 0).sum()) == sum(t.size for t in trees) - saved


def test_sampled_token_repeated_by_every_rollout_stays_per_rollout():
  # Both rollouts sample 4 right after the prompt [1, 2, 3]: 4 is the same token but two draws.
  a = filter_rollout("a", [make_call(0, [1, 2, 3], [4, 5])]).tree
  b = filter_rollout("b", [make_call(0, [1, 2, 3], [4, 6])]).tree
  scores = grpo_advantages([RolloutRecord("a", "t", "h", 1.0, "ok"), RolloutRecord("b", "t", "h", 0.0, "ok")])
  batch = pack_trees([a, b], scores, row_len=16, share_prompts=True)
  assert batch.tokens_RT[0, :7].tolist() == [1, 2, 3, 4, 5, 4, 6]
  assert batch.parent_index_RT[0, :7].tolist() == [-1, 0, 1, 2, 3, 2, 5]
  assert batch.positions_RT[0, :7].tolist() == [0, 1, 2, 3, 4, 3, 4]
  assert batch.subtree_end_RT[0, :7].tolist() == [7, 7, 7, 5, 5, 7, 7]
  assert batch.unique_weight_RT[0, :7].tolist() == [0, 0, 0, 1, 1, 1, 1]
  assert batch.rollout_index_RT[0, :7].tolist() == [0, 0, 0, 0, 0, 1, 1]


def test_rows_and_row_len_limits_with_sharing():
  calls, outcomes = synthetic.agent_group(np.random.default_rng(3), task_id="t", n_rollouts=4, prompt_len=50,
                                          n_calls=2, tokens_per_call=10, vocab_size=50)
  trees, scores = _trees(calls), grpo_advantages(outcomes)
  big = max(t.size for t in trees)
  with pytest.raises(ValueError, match=r"rollout 't/synthetic/\d'.*exceeds row_len"):
    pack_trees(trees, scores, row_len=big - 1, share_prompts=True)
  with pytest.raises(ValueError, match="needs the scores"):
    split_for_rows(trees, row_len=big, rows=1, share_prompts=True)
  # Shared, the four trees fit one row where unshared they need one row each.
  row_len = sum(t.size for t in trees) - 3 * 50
  assert len(split_for_rows(trees, row_len=row_len, rows=1, scores=scores, share_prompts=True)) == 1
  assert len(split_for_rows(trees, row_len=row_len, rows=1)) > 1
  for part in split_for_rows(trees, row_len=big + 60, rows=2, scores=scores, share_prompts=True):
    pack_trees(part, scores, row_len=big + 60, rows=2, share_prompts=True)
