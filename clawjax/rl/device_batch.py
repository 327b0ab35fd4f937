"""PackedBatch -> the arrays one train step consumes: micro-batch split and loss tokens compacted.

The vocab projection is the learner's largest activation (64K tokens x 151K vocab), so it is only done
for trained tokens: each row lists its loss tokens in K slots (`pred_index` = the parent whose hidden
state predicts the token), padded with weight 0. Rows are padded to a multiple of
micro_batches x batch shards with empty rows, then split into micro-batches: shapes [M, rows/M, T] and
[M, rows/M, K].
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from clawjax.tree.batch import PackedBatch


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DeviceBatch:
  tokens: np.ndarray        # [M, r, T] int32
  positions: np.ndarray     # [M, r, T] int32
  segment_ids: np.ndarray   # [M, r, T] int32
  subtree_end: np.ndarray   # [M, r, T] int32
  pred_index: np.ndarray    # [M, r, K] int32 row position whose hidden state predicts the loss token
  targets: np.ndarray       # [M, r, K] int32 the loss token
  weight: np.ndarray        # [M, r, K] float32 the chosen normalisation weight; 0 on empty slots
  logp_rollout: np.ndarray  # [M, r, K] float32
  advantages: np.ndarray    # [M, r, K] float32
  returns: np.ndarray       # [M, r, K] float32


def _weight_RT(batch: PackedBatch, normalisation: str) -> np.ndarray:
  return {"unique": batch.unique_weight_RT, "paths": batch.path_weight_RT}[normalisation]


def loss_slots_needed(batch: PackedBatch, normalisation: str, chunk: int) -> int:
  """The most loss tokens in a row of `batch`, rounded up to a multiple of `chunk` (at least one chunk)."""
  most = int((_weight_RT(batch, normalisation) > 0).sum(axis=1).max(initial=0))
  return -(-max(most, 1) // chunk) * chunk


def prepare_batch(batch: PackedBatch, *, normalisation: str, micro_batches: int, row_multiple: int = 1,
                  chunk: int = 512, loss_slots: int | None = None) -> DeviceBatch:
  """Compact and split `batch`. K = `loss_slots`, or `loss_slots_needed` (a fixed K avoids a recompile
  per batch shape)."""
  weight_RT = _weight_RT(batch, normalisation)
  mask_RT = weight_RT > 0
  if (mask_RT & (batch.parent_index_RT < 0)).any():
    r, t = np.argwhere(mask_RT & (batch.parent_index_RT < 0))[0]
    raise ValueError(f"PackedBatch: loss token at row {r}, position {t} has parent_index -1")
  rows, length = batch.shape
  counts = mask_RT.sum(axis=1)
  k = loss_slots_needed(batch, normalisation, chunk) if loss_slots is None else loss_slots
  if counts.max(initial=0) > k:
    raise ValueError(f"a row has {counts.max()} loss tokens, more than loss_slots={k}")
  step = micro_batches * row_multiple
  padded_rows = -(-rows // step) * step

  def rt(x: np.ndarray, fill: int) -> np.ndarray:
    out = np.full((padded_rows, length), fill, dtype=x.dtype)
    out[:rows] = x
    return out

  idx = np.zeros((padded_rows, k), np.int32)
  valid = np.zeros((padded_rows, k), bool)
  for r in range(rows):
    (pos,) = np.nonzero(mask_RT[r])
    idx[r, :len(pos)] = pos
    valid[r, :len(pos)] = True

  def rk(x_RT: np.ndarray) -> np.ndarray:
    g = np.take_along_axis(rt(x_RT, 0), idx, axis=1)
    return np.where(valid, g, 0).astype(x_RT.dtype)

  padding_end = np.broadcast_to(np.arange(1, length + 1, dtype=np.int32), (padded_rows, length))
  subtree_end = padding_end.copy()
  subtree_end[:rows] = batch.subtree_end_RT
  fields = dict(
      tokens=rt(batch.tokens_RT, 0), positions=rt(batch.positions_RT, 0),
      segment_ids=rt(batch.segment_ids_RT, 0), subtree_end=subtree_end,
      pred_index=np.maximum(rk(batch.parent_index_RT), 0), targets=rk(batch.tokens_RT),
      weight=rk(weight_RT.astype(np.float32)), logp_rollout=rk(batch.rollout_logprobs_RT),
      advantages=rk(batch.advantages_RT), returns=rk(batch.returns_RT))
  return DeviceBatch(**{n: a.reshape(micro_batches, padded_rows // micro_batches, *a.shape[1:])
                        for n, a in fields.items()})
