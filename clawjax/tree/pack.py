"""Kept trees -> `PackedBatch` (see batch.py for the layouts and the attention/prediction rules).

Both layouts cut the trees into *segments* (a whole tree, or one root-to-leaf path) and place them
into rows of `row_len` tokens by first-fit decreasing: largest segment first, each into the first row
with room. A segment longer than `row_len` is an error naming its rollout. For jit-friendly static
shapes pass `rows`: the batch then always has exactly `rows` rows (empty rows are padding) and too
many segments is an error; `split_for_rows` cuts a list of trees into batches that each fit.

Prompt sharing (`share_prompts=True`, tree layout only): the rollouts of one GRPO group start with the
same task prompt, so their trees are merged into one segment that holds the common prefix once. The
prefix is the longest common prefix of the trees' root chains (the tokens before a tree's first branch
point), cut before the first sampled token, so no trained token is ever shared and each rollout's loss
tokens are unchanged. Each tree's remaining tokens follow the prefix, one tree after another, the first
of each a child of the last prefix token; depths (RoPE positions) are unchanged. A group's trees go into
as few merged segments of at most `row_len` tokens as first-fit decreasing finds; groups are never
merged with each other. The prefix's rollout_index is the segment's first rollout (see batch.py).

Routes (CallTree.routes_TLK) travel with their tokens in every layout: a shared prompt keeps the first
tree's (the same prompt computed by the engine for another rollout may have been routed otherwise; that
rollout's replay then uses the first tree's routes for it, as its tokens are the first tree's too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from clawjax.tree.batch import PackedBatch, RolloutScores
from clawjax.tree.build import CallTree


@dataclasses.dataclass
class _Segment:
  """One contiguous causal unit; parent and subtree_end are relative to the segment start. Token i
  belongs to rollout `rollout_ids[rollout_of[i]]` (several rollouts when a group shares its prompt)."""
  rollout_ids: list[str]
  rollout_of: np.ndarray
  tokens: np.ndarray
  positions: np.ndarray
  parent: np.ndarray
  subtree_end: np.ndarray
  unique_weight: np.ndarray
  path_weight: np.ndarray
  logprobs: np.ndarray
  routes: np.ndarray | None = None  # [n, layers, top_k], zeros where `routed` is False
  routed: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.tokens)


def _route_layout(trees: Sequence[CallTree]) -> tuple[tuple[int, ...], np.dtype] | None:
  """The (layers, top_k) and dtype of the trees' routes, None when none has any; trees of one batch must
  agree (one model's)."""
  have = [t for t in trees if t.routes_TLK is not None]
  if not have:
    return None
  shapes = {t.routes_TLK.shape[1:] for t in have}
  if len(shapes) > 1:
    raise ValueError(f"rollouts' routes disagree on [layers, top_k]: {sorted(shapes)} (rollout "
                     f"{have[0].rollout_id!r} and others): one model's calls only")
  return shapes.pop(), np.result_type(*(t.routes_TLK for t in have))


def _tree_routes(t: CallTree, layout: tuple[tuple[int, ...], np.dtype] | None) -> tuple[np.ndarray, np.ndarray]:
  """(routes [T, layers, top_k], routed [T]) of a tree in the batch's route layout (zeros when it has none)."""
  shape, dtype = layout
  if t.routes_TLK is None:
    return np.zeros((t.size, *shape), dtype), np.zeros(t.size, bool)
  return t.routes_TLK.astype(dtype, copy=False), t.routed_T


# A merged segment: the common prefix length and the indices of its trees (prefix 0: one tree).
_Merge = tuple[int, list[int]]


def _tree_segment(trees: Sequence[CallTree], prefix: int) -> _Segment:
  """`trees` one after another under their common first `prefix` tokens, laid out once (as the first
  tree's). Token j >= prefix of tree k moves to j + shift[k]; the prefix spans the whole segment."""
  starts = np.array([0] + [prefix] * (len(trees) - 1))
  lengths = np.array([t.size for t in trees]) - starts
  offsets = np.cumsum(lengths) - lengths
  shift = offsets - starts
  total = int(lengths.sum())

  def cat(f: Callable[[int, CallTree], np.ndarray]) -> np.ndarray:
    return np.concatenate([f(k, t)[starts[k]:] for k, t in enumerate(trees)])

  trained = cat(lambda k, t: t.owner_T >= 0)
  layout = _route_layout(trees)
  routes = routed = None
  if layout is not None:
    routes = cat(lambda k, t: _tree_routes(t, layout)[0])
    routed = cat(lambda k, t: _tree_routes(t, layout)[1])
  return _Segment(
      rollout_ids=[t.rollout_id for t in trees],
      rollout_of=cat(lambda k, t: np.full(t.size, k, np.int32)),
      tokens=cat(lambda k, t: t.tokens_T), positions=cat(lambda k, t: t.depth_T),
      parent=cat(lambda k, t: np.where(t.parent_T >= prefix, t.parent_T + shift[k], t.parent_T)),
      subtree_end=cat(lambda k, t: np.where(np.arange(t.size) < prefix, total, t.subtree_end_T + shift[k])),
      unique_weight=trained.astype(np.float32),
      path_weight=np.where(trained, cat(lambda k, t: t.paths_T), 0).astype(np.float32),
      logprobs=cat(lambda k, t: t.logprobs_T), routes=routes, routed=routed)


def _shareable(t: CallTree) -> int:
  """How many leading tokens of `t` may be shared: its root chain, up to the first sampled token."""
  hit = np.flatnonzero((t.subtree_end_T != t.size) | (t.owner_T >= 0))
  return int(hit[0]) if len(hit) else t.size


def _common_prefix(trees: Sequence[CallTree]) -> int:
  first = trees[0].tokens_T
  p = _shareable(trees[0])
  for t in trees[1:]:
    k = min(p, _shareable(t))
    diff = np.flatnonzero(first[:k] != t.tokens_T[:k])
    p = int(diff[0]) if len(diff) else k
  return p


def _plan(trees: Sequence[CallTree], groups: Sequence[int] | None, row_len: int) -> list[_Merge]:
  """The tree layout's segments: one per tree, or (with `groups`, the group of each tree) merged per
  group under its common prefix. A tree longer than `row_len` stays alone (pack reports it)."""
  if groups is None:
    return [(0, [i]) for i in range(len(trees))]
  members: dict[int, list[int]] = {}
  for i, g in enumerate(groups):
    members.setdefault(g, []).append(i)
  plan: list[_Merge] = []
  for idx in members.values():
    plan += [(0, [i]) for i in idx if trees[i].size > row_len]
    fits = [i for i in idx if trees[i].size <= row_len]
    p = _common_prefix([trees[i] for i in fits]) if len(fits) > 1 else 0
    if p == 0:
      plan += [(0, [i]) for i in fits]
      continue
    bin_of = first_fit([trees[i].size - p for i in fits], row_len - p)
    plan += [(p, [i for i, b in zip(fits, bin_of) if b == k]) for k in range(max(bin_of) + 1)]
  return plan


def _merge_size(trees: Sequence[CallTree], merge: _Merge) -> int:
  p, idx = merge
  return p + sum(trees[i].size - p for i in idx)


def _path_segments(t: CallTree) -> list[_Segment]:
  counted = np.zeros(t.size, bool)  # tokens already weighted by an earlier path of this rollout
  out = []
  for leaf in t.leaves_L:
    idx = t.path(int(leaf))
    n = len(idx)
    trained = t.owner_T[idx] >= 0
    first = trained & ~counted[idx]
    counted[idx] = True
    out.append(_Segment([t.rollout_id], np.zeros(n, np.int32), t.tokens_T[idx],
                        np.arange(n, dtype=np.int32), np.arange(-1, n - 1, dtype=np.int32),
                        np.full(n, n, np.int32), first.astype(np.float32), trained.astype(np.float32),
                        t.logprobs_T[idx], None if t.routes_TLK is None else t.routes_TLK[idx],
                        None if t.routed_T is None else t.routed_T[idx]))
  return out


def first_fit(sizes: Sequence[int], row_len: int) -> list[int]:
  """Row of each item under first-fit decreasing (ties keep input order)."""
  free: list[int] = []
  row_of = [0] * len(sizes)
  for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
    if sizes[i] > row_len:
      raise ValueError(f"item {i} has {sizes[i]} tokens, more than row_len={row_len}")
    r = next((r for r, f in enumerate(free) if f >= sizes[i]), len(free))
    if r == len(free):
      free.append(row_len)
    free[r] -= sizes[i]
    row_of[i] = r
  return row_of


def _score_index(trees: Sequence[CallTree], scores: RolloutScores) -> dict[str, int]:
  index = scores.index()
  for t in trees:
    if t.rollout_id not in index:
      raise ValueError(f"rollout {t.rollout_id!r} has no score (no rollout record with status 'ok')")
  return index


def _groups(trees: Sequence[CallTree], scores: RolloutScores | None,
            share_prompts: bool) -> list[int] | None:
  """The GRPO group of each tree when sharing prompts, else None."""
  if not share_prompts:
    return None
  index = _score_index(trees, scores)
  return [int(scores.group_ids_N[index[t.rollout_id]]) for t in trees]


def pack_trees(trees: Sequence[CallTree], scores: RolloutScores, *, row_len: int,
               rows: int | None = None, share_prompts: bool = False,
               rows_of: Sequence[int] | None = None) -> PackedBatch:
  """The tree layout: each tree one segment, a shared prefix stored once; with `share_prompts`, the
  trees of a GRPO group (scores.group_ids_N) also store their common task prompt once. `rows_of`: the
  row of each tree (non-empty trees, without `share_prompts`) when the caller planned the rows itself
  (the SFT stage's length binning), in place of first-fit decreasing."""
  if rows_of is not None and (share_prompts or len(rows_of) != len(trees) or not all(t.size for t in trees)):
    raise ValueError("pack_trees: rows_of needs one row per tree, non-empty trees and no share_prompts")
  def segments_of(kept: list[CallTree]) -> list[_Segment]:
    plan = _plan(kept, _groups(kept, scores, share_prompts), row_len)
    return [_tree_segment([kept[i] for i in idx], p) for p, idx in plan]
  return _pack(trees, scores, segments_of, row_len, rows, rows_of)


def pack_paths(trees: Sequence[CallTree], scores: RolloutScores, *, row_len: int,
               rows: int | None = None) -> PackedBatch:
  """The paths layout: one causal segment per root-to-leaf path (the learner's reference)."""
  return _pack(trees, scores, lambda kept: [s for t in kept for s in _path_segments(t)], row_len, rows)


def split_for_rows(trees: Sequence[CallTree], *, row_len: int, rows: int,
                   scores: RolloutScores | None = None,
                   share_prompts: bool = False) -> list[list[CallTree]]:
  """Consecutive groups of `trees` whose tree layout fits `rows` x `row_len` (order kept); with
  `share_prompts` (needs `scores`), the layout of `pack_trees(..., share_prompts=True)`."""
  if share_prompts and scores is None:
    raise ValueError("split_for_rows: share_prompts needs the scores (the GRPO group of each tree)")
  batches: list[list[CallTree]] = []
  current: list[CallTree] = []
  for t in trees:
    if t.size > row_len:
      raise ValueError(f"rollout {t.rollout_id!r}: tree of {t.size} tokens exceeds row_len={row_len}")
    trial = current + [t]
    if current and _rows_needed(trial, scores, row_len, share_prompts) > rows:
      batches.append(current)
      trial = [t]
    current = trial
  if current:
    batches.append(current)
  return batches


def _rows_needed(trees: list[CallTree], scores: RolloutScores | None, row_len: int,
                 share_prompts: bool) -> int:
  kept = [t for t in trees if t.size]
  plan = _plan(kept, _groups(kept, scores, share_prompts), row_len)
  return max(first_fit([_merge_size(kept, m) for m in plan], row_len), default=-1) + 1


def _pack(trees: Sequence[CallTree], scores: RolloutScores,
          segments_of: Callable[[list[CallTree]], list[_Segment]], row_len: int,
          rows: int | None, row_of: Sequence[int] | None = None) -> PackedBatch:
  trees = [t for t in trees if t.size]
  index = _score_index(trees, scores)
  segments = segments_of(trees)
  for s in segments:
    if len(s) > row_len:
      raise ValueError(f"rollout {s.rollout_ids[0]!r}: a segment of {len(s)} tokens exceeds "
                       f"row_len={row_len}; raise row_len or lower the rollout's context")
  if row_of is None:
    row_of = first_fit([len(s) for s in segments], row_len)
  else:
    fill = np.bincount(np.asarray(row_of, np.int64), weights=[len(s) for s in segments])
    if len(fill) and fill.max() > row_len:
      raise ValueError(f"rows_of puts {int(fill.max())} tokens in row {int(fill.argmax())}, more than "
                       f"row_len={row_len}")
  n_rows = max(row_of, default=-1) + 1
  if rows is not None:
    if n_rows > rows:
      raise ValueError(f"{len(segments)} segments need {n_rows} rows of {row_len}, only {rows} "
                       f"allowed; use split_for_rows")
    n_rows = rows
  shape = (n_rows, row_len)
  i32 = lambda fill: np.full(shape, fill, np.int32)
  f32 = lambda: np.zeros(shape, np.float32)
  b = PackedBatch(
      tokens_RT=i32(0), positions_RT=i32(0), parent_index_RT=i32(-1),
      subtree_end_RT=np.broadcast_to(np.arange(1, row_len + 1, dtype=np.int32), shape).copy(),
      segment_ids_RT=i32(0), unique_weight_RT=f32(), path_weight_RT=f32(), rollout_logprobs_RT=f32(),
      advantages_RT=f32(), returns_RT=f32(), baselines_RT=f32(), rollout_index_RT=i32(-1),
      rollout_ids_N=[], group_ids_N=np.zeros(0, np.int32), rewards_N=np.zeros(0, np.float32))
  layout = _route_layout(trees)
  if layout is not None:
    b.routes_RTLK = np.zeros((*shape, *layout[0]), layout[1])
    b.routed_RT = np.zeros(shape, bool)
  local: dict[str, int] = {}
  fill = [0] * n_rows
  n_segments = [0] * n_rows
  for s, r in zip(segments, row_of):
    n_T = np.array([local.setdefault(rid, len(local)) for rid in s.rollout_ids])[s.rollout_of]
    k_T = np.array([index[rid] for rid in s.rollout_ids])[s.rollout_of]
    a, z = fill[r], fill[r] + len(s)
    fill[r] = z
    n_segments[r] += 1
    trained = s.unique_weight + s.path_weight > 0
    b.tokens_RT[r, a:z] = s.tokens
    b.positions_RT[r, a:z] = s.positions
    b.parent_index_RT[r, a:z] = np.where(s.parent >= 0, s.parent + a, -1)
    b.subtree_end_RT[r, a:z] = s.subtree_end + a
    b.segment_ids_RT[r, a:z] = n_segments[r]
    b.unique_weight_RT[r, a:z] = s.unique_weight
    b.path_weight_RT[r, a:z] = s.path_weight
    b.rollout_logprobs_RT[r, a:z] = np.where(trained, s.logprobs, 0)
    b.advantages_RT[r, a:z] = np.where(trained, scores.advantages_N[k_T], 0)
    b.returns_RT[r, a:z] = np.where(trained, scores.rewards_N[k_T], 0)
    b.baselines_RT[r, a:z] = np.where(trained, scores.baselines_N[k_T], 0)
    b.rollout_index_RT[r, a:z] = n_T
    if s.routes is not None:
      b.routes_RTLK[r, a:z] = s.routes
      b.routed_RT[r, a:z] = s.routed
  order = [index[rid] for rid in local]
  b.rollout_ids_N = list(local)
  b.group_ids_N = scores.group_ids_N[order].astype(np.int32)
  b.rewards_N = scores.rewards_N[order].astype(np.float32)
  return b
