"""Routes through the tree: each tree token gets the route its first computing call logged (a call logging
only the positions past an earlier call's, as the shim does), later calls that disagree are counted, and
packing keeps every route beside its token in both layouts and with shared prompts."""
import dataclasses
import zlib

import numpy as np
from hypothesis import given, settings, strategies as st

from clawjax.calllog import RolloutRecord
from clawjax.rl.advantages import grpo_advantages
from clawjax.routes import RoutedExperts
from clawjax.tree.build import build_tree
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_paths, pack_trees

from tests.tree.reference import make_call, rollouts

SETTINGS = settings(max_examples=25, deadline=None)
LAYERS, TOP_K = 3, 2


def route_of(prefix) -> np.ndarray:
  """The engine's route of the last token of `prefix` (a function of the whole prefix), [layers, top_k]."""
  h = zlib.crc32(np.asarray(prefix, np.int32).tobytes())
  return ((h + 17 * np.arange(LAYERS)[:, None] + np.arange(TOP_K)[None, :]) % 251).astype(np.uint8)


def with_routes(calls):
  """Each ok call with its routes as the shim logs them: past the longest earlier call whose input + output
  starts its input (that call's routes cover the rest), else whole."""
  done, out = [], []
  for c in sorted(calls, key=lambda c: c.call_index):
    if c.status != "ok":
      out.append(c)
      continue
    seq = c.input_ids + c.output_ids
    refs = [e for e in done if len(e.input_ids) + len(e.output_ids) <= len(c.input_ids)
            and c.input_ids[:len(e.input_ids) + len(e.output_ids)] == e.input_ids + e.output_ids]
    before = max(refs, key=lambda e: e.routed_experts.end, default=None)
    start = 0 if before is None else before.routed_experts.end
    ids = np.stack([route_of(seq[:p + 1]) for p in range(start, len(seq) - 1)]).reshape(-1, LAYERS, TOP_K)
    c = dataclasses.replace(c, routed_experts=RoutedExperts(start, ids, None if before is None else before.routed_experts))
    done.append(c)
    out.append(c)
  return out


def prefixes(tokens, parent):
  """The root-to-token token tuple of every position (by the parent pointers)."""
  out = []
  for i in range(len(tokens)):
    chain, j = [], i
    while j >= 0:
      chain.append(int(tokens[j]))
      j = int(parent[j])
    out.append(tuple(chain[::-1]))
  return out


@given(rollouts(vocab_size=20, max_calls=6))
@SETTINGS
def test_every_tree_token_has_the_route_of_the_calls_that_computed_it(calls):
  calls = with_routes(calls)
  kept = [c for c in calls if c.status == "ok"]
  tree = build_tree("r", kept)
  computed = {tuple(c.input_ids + c.output_ids)[:p + 1] for c in kept
              for p in range(len(c.input_ids) + len(c.output_ids) - 1)}
  prefix_T = prefixes(tree.tokens_T, tree.parent_T)
  if not computed:
    assert tree.routes_TLK is None
    return
  assert [p in computed for p in prefix_T] == tree.routed_T.tolist()
  for i, p in enumerate(prefix_T):
    if tree.routed_T[i]:
      assert np.array_equal(tree.routes_TLK[i], route_of(p))
  assert tree.route_disagree == 0


def test_the_first_computing_call_wins_and_disagreement_is_counted_as_sets():
  # Call 1 re-sends call 0's input whole (another engine, no reference): its routes of positions 1 and 2
  # differ from call 0's, of position 0 only in the order of the experts.
  c0 = make_call(0, [5, 6, 7, 8], [9, 10])
  c1 = make_call(1, [5, 6, 7, 8], [11])
  r0 = np.stack([route_of([5, 6, 7, 8, 9, 10][:p + 1]) for p in range(5)])
  r1 = r0[:4].copy()
  r1[0] = r1[0][:, ::-1]
  r1[1:3] = (r1[1:3] + 1) % 251
  tree = build_tree("r", [dataclasses.replace(c0, routed_experts=RoutedExperts(0, r0)),
                          dataclasses.replace(c1, routed_experts=RoutedExperts(0, r1))])
  assert tree.route_disagree == 2
  prefix_T = prefixes(tree.tokens_T, tree.parent_T)
  for i, p in enumerate(prefix_T):
    assert tree.routed_T[i] == (p not in {(5, 6, 7, 8, 9, 10), (5, 6, 7, 8, 11)})
    if tree.routed_T[i]:
      assert np.array_equal(tree.routes_TLK[i], route_of(p))  # call 0's


@st.composite
def routed_groups(draw):
  """1-4 filtered rollouts with routes (some without), two GRPO groups sharing a task prompt each."""
  trees, outcomes = [], []
  prompt = draw(st.lists(st.integers(16, 19), min_size=1, max_size=4))
  for i, calls in enumerate(draw(st.lists(rollouts(vocab_size=20, max_calls=5), min_size=1, max_size=4))):
    calls = [dataclasses.replace(c, input_ids=tuple(prompt) + c.input_ids, rollout_id=f"r{i}") for c in calls]
    rid = f"r{i}"
    calls = with_routes(calls) if draw(st.booleans()) or i == 0 else calls
    trees.append(filter_rollout(rid, calls).tree)
    outcomes.append(RolloutRecord(rid, f"task{i % 2}", "h", draw(st.floats(0, 1)), "ok"))
  return trees, grpo_advantages(outcomes)


@given(routed_groups(), st.sampled_from(["tree", "shared", "paths"]))
@SETTINGS
def test_packed_routes_stay_beside_their_tokens(trees_scores, layout):
  trees, scores = trees_scores
  row_len = max(t.size for t in trees) * 3 + 8
  if layout == "paths":
    batch = pack_paths(trees, scores, row_len=max(t.path_tokens() for t in trees) + 8)
  else:
    batch = pack_trees(trees, scores, row_len=row_len, share_prompts=layout == "shared")
  if all(t.routes_TLK is None for t in trees):
    assert batch.routes_RTLK is None
    return
  assert batch.routes_RTLK.shape == (*batch.shape, LAYERS, TOP_K)
  # Each token's route is its rollout's tree's (a shared prompt's rollout is its segment's first).
  by_rollout = {t.rollout_id: dict(zip(prefixes(t.tokens_T, t.parent_T),
                                       zip(t.routed_T if t.routed_T is not None else [False] * t.size,
                                           t.routes_TLK if t.routes_TLK is not None else [None] * t.size)))
                for t in trees}
  for r in range(batch.shape[0]):
    for i, p in enumerate(prefixes(batch.tokens_RT[r], batch.parent_index_RT[r])):
      if batch.segment_ids_RT[r, i] == 0:
        assert not batch.routed_RT[r, i]
        continue
      routed, route = by_rollout[batch.rollout_ids_N[batch.rollout_index_RT[r, i]]][p]
      assert batch.routed_RT[r, i] == routed
      if routed:
        assert np.array_equal(batch.routes_RTLK[r, i], route) and np.array_equal(route, route_of(p))
