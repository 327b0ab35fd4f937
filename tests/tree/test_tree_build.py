"""The prefix tree against an uncompressed dict trie and brute-force ancestor relations."""

import numpy as np
from hypothesis import given, settings, strategies as st

from clawjax.calllog import CallRecord
from clawjax.tree.build import Trie, build_tree
from clawjax.tree.filters import filter_rollout

from tests.tree.reference import NaiveTrie, ancestor_matrix, make_call, rollouts, tree_to_naive

SETTINGS = settings(max_examples=40, deadline=None)


def check_tree(calls: list[CallRecord]) -> None:
  tree = build_tree("r", calls)
  naive = NaiveTrie(calls)
  # Same token set: the tree's tokens map one-to-one onto the naive trie's nodes.
  assert tree.size == naive.size
  node = tree_to_naive(tree.tokens_T, tree.parent_T, naive)
  assert (node > 0).all() and len(set(node.tolist())) == tree.size
  # Every call's input + output is a root-to-node path.
  assert set(naive.path_node.values()) - {0} <= set(node.tolist())
  # Depth, ownership (earliest sampler), log-probs, paths through each token, leaves.
  assert (tree.depth_T == np.array(naive.depth)[node]).all()
  assert (tree.owner_T == np.array(naive.owner)[node]).all()
  np.testing.assert_array_equal(tree.logprobs_T, np.array(naive.logp, np.float32)[node])
  assert (tree.paths_T == naive.paths_through()[node]).all()
  assert len(tree.leaves_L) == len(naive.leaves())
  assert tree.path_tokens() == sum(naive.depth[l] + 1 for l in naive.leaves())
  # subtree_end encodes exactly the ancestor-or-self relation.
  anc = ancestor_matrix(tree.parent_T)
  idx = np.arange(tree.size)
  rule = (idx[None, :] <= idx[:, None]) & (idx[:, None] < tree.subtree_end_T[None, :])
  assert (rule == anc).all()
  for leaf in tree.leaves_L:
    path = tree.path(int(leaf))
    assert (tree.depth_T[path] == np.arange(len(path))).all()
    assert anc[path[-1], path].all()


@given(rollouts(vocab_size=20))
@SETTINGS
def test_tree_of_all_ok_calls_small_vocab(calls):
  # A 4-token content vocabulary makes accidental merges and branches inside outputs common.
  check_tree([c for c in calls if c.status == "ok"])


@given(rollouts())
@SETTINGS
def test_kept_tree_holds_every_trained_call(calls):
  f = filter_rollout("r", calls)
  check_tree(f.trained)


@given(st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=12),
       st.lists(st.integers(0, 3), max_size=14))
@settings(max_examples=100, deadline=None)
def test_trie_walk_is_longest_common_prefix(seqs, query):
  trie = Trie()
  for s in seqs:
    trie.insert(np.array(s, np.int32), cuts=(len(s) // 2, len(s)))
  full, matched = trie.walk(np.array(query, np.int32))
  lcp = max(next((k for k, (a, b) in enumerate(zip(s, query)) if a != b), min(len(s), len(query)))
            for s in seqs)
  assert matched == lcp
  assert [trie.end(n) for n in full] == sorted(trie.end(n) for n in full)
  assert all(trie.end(n) <= matched for n in full)


def test_same_sample_from_same_context_is_trained_once():
  # Two calls sampled [7, 8, 9] and [7, 8, 5] from [1, 2]: the shared [7, 8] is one event.
  calls = [make_call(0, [1, 2], [7, 8, 9]), make_call(1, [1, 2], [7, 8, 5]),
           make_call(2, [1, 2, 7, 8, 5, 4], [6])]
  tree = build_tree("r", calls)
  assert tree.size == 2 + 3 + 1 + 2
  assert int((tree.owner_T >= 0).sum()) == 5  # 7, 8 (call 0), 9 (call 0), 5 (call 1), 6 (call 2)
  owners = dict(zip(tree.tokens_T.tolist(), tree.owner_T.tolist()))
  assert owners[7] == owners[8] == owners[9] == 0 and owners[5] == 1 and owners[4] == -1


def test_input_repeating_an_output_merges_and_keeps_it_sampled():
  calls = [make_call(0, [1, 2], [3, 4]), make_call(1, [1, 2, 3, 4, 5], [6])]
  tree = build_tree("r", calls)
  assert tree.tokens_T.tolist() == [1, 2, 3, 4, 5, 6]
  assert tree.owner_T.tolist() == [-1, -1, 0, 0, -1, 1]
  assert len(tree.leaves_L) == 1
