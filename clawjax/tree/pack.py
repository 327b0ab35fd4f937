"""Kept trees -> `PackedBatch` (see batch.py for the layouts and the attention/prediction rules).

Both layouts cut the trees into *segments* (a whole tree, or one root-to-leaf path) and place them
into rows of `row_len` tokens by first-fit decreasing: largest segment first, each into the first row
with room. A segment longer than `row_len` is an error naming its rollout. For jit-friendly static
shapes pass `rows`: the batch then always has exactly `rows` rows (empty rows are padding) and too
many segments is an error; `split_for_rows` cuts a list of trees into batches that each fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from clawjax.rl.advantages import RolloutScores
from clawjax.tree.batch import PackedBatch
from clawjax.tree.build import CallTree


@dataclasses.dataclass
class _Segment:
  """One contiguous causal unit; parent and subtree_end are relative to the segment start."""
  rollout_id: str
  tokens: np.ndarray
  positions: np.ndarray
  parent: np.ndarray
  subtree_end: np.ndarray
  unique_weight: np.ndarray
  path_weight: np.ndarray
  logprobs: np.ndarray

  def __len__(self) -> int:
    return len(self.tokens)


def _tree_segments(t: CallTree) -> list[_Segment]:
  trained = t.owner_T >= 0
  return [_Segment(t.rollout_id, t.tokens_T, t.depth_T, t.parent_T, t.subtree_end_T,
                   trained.astype(np.float32), np.where(trained, t.paths_T, 0).astype(np.float32),
                   t.logprobs_T)]


def _path_segments(t: CallTree) -> list[_Segment]:
  counted = np.zeros(t.size, bool)  # tokens already weighted by an earlier path of this rollout
  out = []
  for leaf in t.leaves_L:
    idx = t.path(int(leaf))
    n = len(idx)
    trained = t.owner_T[idx] >= 0
    first = trained & ~counted[idx]
    counted[idx] = True
    out.append(_Segment(t.rollout_id, t.tokens_T[idx], np.arange(n, dtype=np.int32),
                        np.arange(-1, n - 1, dtype=np.int32), np.full(n, n, np.int32),
                        first.astype(np.float32), trained.astype(np.float32), t.logprobs_T[idx]))
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


def pack_trees(trees: Sequence[CallTree], scores: RolloutScores, *, row_len: int,
               rows: int | None = None) -> PackedBatch:
  """The tree layout: each tree one segment, a shared prefix stored once."""
  return _pack(trees, scores, _tree_segments, row_len, rows)


def pack_paths(trees: Sequence[CallTree], scores: RolloutScores, *, row_len: int,
               rows: int | None = None) -> PackedBatch:
  """The paths layout: one causal segment per root-to-leaf path (the learner's reference)."""
  return _pack(trees, scores, _path_segments, row_len, rows)


def split_for_rows(trees: Sequence[CallTree], *, row_len: int, rows: int) -> list[list[CallTree]]:
  """Consecutive groups of `trees` whose tree layout fits `rows` x `row_len` (order kept)."""
  batches: list[list[CallTree]] = []
  current: list[CallTree] = []
  for t in trees:
    if t.size > row_len:
      raise ValueError(f"rollout {t.rollout_id!r}: tree of {t.size} tokens exceeds row_len={row_len}")
    trial = current + [t]
    if current and max(first_fit([x.size for x in trial], row_len)) + 1 > rows:
      batches.append(current)
      trial = [t]
    current = trial
  if current:
    batches.append(current)
  return batches


def _pack(trees: Sequence[CallTree], scores: RolloutScores, segments_of, row_len: int,
          rows: int | None) -> PackedBatch:
  index = scores.index()
  trees = [t for t in trees if t.size]
  for t in trees:
    if t.rollout_id not in index:
      raise ValueError(f"rollout {t.rollout_id!r} has no score (no rollout record with status 'ok')")
  segments = [s for t in trees for s in segments_of(t)]
  for s in segments:
    if len(s) > row_len:
      raise ValueError(f"rollout {s.rollout_id!r}: a segment of {len(s)} tokens exceeds "
                       f"row_len={row_len}; raise row_len or lower the rollout's context")
  row_of = first_fit([len(s) for s in segments], row_len)
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
      advantages_RT=f32(), returns_RT=f32(), rollout_index_RT=i32(-1),
      rollout_ids_N=[], group_ids_N=np.zeros(0, np.int32), rewards_N=np.zeros(0, np.float32))
  local: dict[str, int] = {}
  fill = [0] * n_rows
  n_segments = [0] * n_rows
  for s, r in zip(segments, row_of):
    n = local.setdefault(s.rollout_id, len(local))
    a, z = fill[r], fill[r] + len(s)
    fill[r] = z
    n_segments[r] += 1
    k = index[s.rollout_id]
    trained = s.unique_weight + s.path_weight > 0
    b.tokens_RT[r, a:z] = s.tokens
    b.positions_RT[r, a:z] = s.positions
    b.parent_index_RT[r, a:z] = np.where(s.parent >= 0, s.parent + a, -1)
    b.subtree_end_RT[r, a:z] = s.subtree_end + a
    b.segment_ids_RT[r, a:z] = n_segments[r]
    b.unique_weight_RT[r, a:z] = s.unique_weight
    b.path_weight_RT[r, a:z] = s.path_weight
    b.rollout_logprobs_RT[r, a:z] = np.where(trained, s.logprobs, 0)
    b.advantages_RT[r, a:z] = np.where(trained, scores.advantages_N[k], 0)
    b.returns_RT[r, a:z] = np.where(trained, scores.rewards_N[k], 0)
    b.rollout_index_RT[r, a:z] = n
  order = [index[rid] for rid in local]
  b.rollout_ids_N = list(local)
  b.group_ids_N = scores.group_ids_N[order].astype(np.int32)
  b.rewards_N = scores.rewards_N[order].astype(np.float32)
  return b
