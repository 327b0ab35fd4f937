"""Length-binned packing: an epoch's trees -> batches of `rows` rows of `row_len` tokens.

Each tree is one segment of a row (its own segment id: the tree attention mask keeps segments apart, so
no token attends across conversations) at its own positions. An epoch deals the trees in a seeded order
into pools of `pool_batches` batches' worth of tokens; each pool is packed largest first into rows
(first-fit decreasing: the sorting that keeps padding low when lengths are skewed), the epoch's rows are
shuffled (seeded) and cut into batches. Only the last batch of an epoch may have empty rows. The plan is
a function of (seed, epoch) and the tree sizes, so a resumed run replays it exactly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from clawjax.tree.batch import PackedBatch, RolloutScores
from clawjax.tree.build import CallTree
from clawjax.tree.pack import first_fit, pack_trees


@dataclasses.dataclass(frozen=True)
class BatchPlan:
  """One batch: the trees it holds (indices into the epoch's tree list) and the row of each."""
  trees: tuple[int, ...]
  rows_of: tuple[int, ...]


def plan_epoch(sizes: Sequence[int], *, row_len: int, rows: int, pool_batches: int, seed: int,
               epoch: int, shuffle: bool = True) -> list[BatchPlan]:
  """The batches of one epoch over trees of `sizes` tokens (each <= row_len). Without `shuffle` (the
  held-out set) the trees and rows keep their order."""
  sizes = np.asarray(sizes, np.int64)
  if len(sizes) and sizes.max() > row_len:
    raise ValueError(f"a tree of {sizes.max()} tokens does not fit row_len={row_len}")
  rng = np.random.default_rng([seed, epoch])
  order = rng.permutation(len(sizes)) if shuffle else np.arange(len(sizes))
  pool_tokens = pool_batches * rows * row_len
  all_rows: list[list[int]] = []
  start = 0
  while start < len(order):
    total = np.cumsum(sizes[order[start:]])
    stop = start + max(int(np.searchsorted(total, pool_tokens, side="right")), 1)
    pool = order[start:stop]
    row_of = first_fit(sizes[pool].tolist(), row_len)
    pool_rows: list[list[int]] = [[] for _ in range(max(row_of) + 1)]
    for i, r in zip(pool.tolist(), row_of):
      pool_rows[r].append(i)
    all_rows += pool_rows
    start = stop
  if shuffle:
    all_rows = [all_rows[i] for i in rng.permutation(len(all_rows))]
  return [BatchPlan(tuple(i for row in batch for i in row),
                    tuple(r for r, row in enumerate(batch) for _ in row))
          for batch in (all_rows[k:k + rows] for k in range(0, len(all_rows), rows))]


def zero_scores(trees: Sequence[CallTree]) -> RolloutScores:
  """Scores that a tree-packed batch needs for each tree: SFT has no rewards or advantages."""
  n = len(trees)
  return RolloutScores(rollout_ids=[t.rollout_id for t in trees], group_ids_N=np.zeros(n, np.int32),
                       rewards_N=np.zeros(n, np.float32), advantages_N=np.zeros(n, np.float32),
                       baselines_N=np.zeros(n, np.float32), groups=[("sft", "sft", None)], singleton_groups=0, zero_variance_groups=0)


def pack(trees: Sequence[CallTree], plan: BatchPlan, *, row_len: int, rows: Sequence[int]) -> PackedBatch:
  """Rows `rows` of the batch `plan` describes, in that order, `row_len` tokens each (a row the plan does
  not fill is empty): all of them, or the share one process feeds (clawjax.rl.learner `process_rows`)."""
  where = {r: i for i, r in enumerate(rows)}
  kept = [(t, where[r]) for t, r in zip(plan.trees, plan.rows_of) if r in where]
  chosen = [trees[t] for t, _ in kept]
  return pack_trees(chosen, zero_scores(chosen), row_len=row_len, rows=len(rows), rows_of=[r for _, r in kept])


def padding_fraction(batch: PackedBatch) -> float:
  """The share of the batch's token slots that hold no token."""
  return float(np.mean(batch.segment_ids_RT == 0))
