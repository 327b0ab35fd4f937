"""PackedBatch -> the arrays one train step consumes: micro-batch split and loss tokens compacted.

The vocab projection is the learner's largest activation (64K tokens x 151K vocab), so it is only done
for trained tokens: each row lists its loss tokens in K slots (`pred_index` = the parent whose hidden
state predicts the token), padded with weight 0. Rows are padded to a multiple of
micro_batches x batch shards with empty rows, then split into micro-batches: shapes [M, rows/M, T] and
[M, rows/M, K].

In a run of several processes each prepares only its own rows; the shapes must still agree, since the
processes' rows become one global array: `BatchShape` is what one process's batch needs, and
`agree_shapes` the shapes every process pads to (the most rows, row length and loss slots any process
needs, batch by batch; a process with fewer batches pads with batches of empty rows, `empty_batch`).
Empty rows carry no weight, so they change neither the loss nor its normaliser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """The padded size of one prepared batch: `rows` (a multiple of micro-batches x row shards), the row
  length T and the loss slots K per row."""
  rows: int
  length: int
  loss_slots: int


def batch_shape(batch: PackedBatch, *, normalisation: str, micro_batches: int, row_multiple: int = 1,
                chunk: int = 512) -> BatchShape:
  """The smallest shape `batch` fits: rows rounded up to a multiple of micro_batches x row_multiple."""
  step = micro_batches * row_multiple
  rows, length = batch.shape
  return BatchShape(-(-rows // step) * step, length, loss_slots_needed(batch, normalisation, chunk))


def agree_shapes(per_process: Sequence[Sequence[BatchShape]]) -> list[BatchShape]:
  """The shapes every process prepares its batches in, given each process's own list: as many batches as
  the longest list, batch i as large as the largest batch i in any dimension (every process passes the
  same row multiple, so the most rows are a multiple of it)."""
  count = max((len(shapes) for shapes in per_process), default=0)
  out = []
  for i in range(count):
    shapes = [shapes[i] for shapes in per_process if i < len(shapes)]
    out.append(BatchShape(*(max(getattr(s, f.name) for s in shapes) for f in dataclasses.fields(BatchShape))))
  return out


def _empty_rows(rows: int, length: int, loss_slots: int) -> dict[str, np.ndarray]:
  """The fields of `rows` empty rows: no segment, no loss slot (weight 0), each position its own subtree."""
  rt = lambda: np.zeros((rows, length), np.int32)
  rk = lambda dtype: np.zeros((rows, loss_slots), dtype)
  return dict(tokens=rt(), positions=rt(), segment_ids=rt(),
              subtree_end=np.broadcast_to(np.arange(1, length + 1, dtype=np.int32), (rows, length)).copy(),
              pred_index=rk(np.int32), targets=rk(np.int32), weight=rk(np.float32), logp_rollout=rk(np.float32),
              advantages=rk(np.float32), returns=rk(np.float32))


def _split(fields: dict[str, np.ndarray], micro_batches: int) -> DeviceBatch:
  return DeviceBatch(**{n: a.reshape(micro_batches, a.shape[0] // micro_batches, *a.shape[1:])
                        for n, a in fields.items()})


def empty_batch(shape: BatchShape, micro_batches: int) -> DeviceBatch:
  """A batch of `shape` with empty rows only (what a process without rows for a step contributes)."""
  return _split(_empty_rows(shape.rows, shape.length, shape.loss_slots), micro_batches)


def prepare_batch(batch: PackedBatch, *, normalisation: str, micro_batches: int, row_multiple: int = 1,
                  chunk: int = 512, shape: BatchShape | None = None) -> DeviceBatch:
  """Compact and split `batch`, padded to `shape` (default: `batch_shape`, the smallest it fits). A shape
  fixed across batches (more rows, a longer row, more loss slots K) avoids a recompile per batch shape."""
  weight_RT = _weight_RT(batch, normalisation)
  mask_RT = weight_RT > 0
  if (mask_RT & (batch.parent_index_RT < 0)).any():
    r, t = np.argwhere(mask_RT & (batch.parent_index_RT < 0))[0]
    raise ValueError(f"PackedBatch: loss token at row {r}, position {t} has parent_index -1")
  rows, length = batch.shape
  counts = mask_RT.sum(axis=1)
  fits = batch_shape(batch, normalisation=normalisation, micro_batches=micro_batches, row_multiple=row_multiple,
                     chunk=chunk)
  shape = shape or fits
  k = shape.loss_slots
  if counts.max(initial=0) > k:
    raise ValueError(f"a row has {counts.max()} loss tokens, more than loss_slots={k}")
  if shape.rows < fits.rows or shape.rows % (micro_batches * row_multiple) or shape.length < length:
    raise ValueError(f"a batch of {rows} rows x {length} tokens does not fit {shape} "
                     f"({micro_batches} micro-batches x {row_multiple} row shards)")

  idx = np.zeros((rows, k), np.int32)
  valid = np.zeros((rows, k), bool)
  for r in range(rows):
    (pos,) = np.nonzero(mask_RT[r])
    idx[r, :len(pos)] = pos
    valid[r, :len(pos)] = True

  def rk(x_RT: np.ndarray) -> np.ndarray:
    return np.where(valid, np.take_along_axis(x_RT, idx, axis=1), 0)

  fields = _empty_rows(shape.rows, shape.length, k)
  for name, x in dict(tokens=batch.tokens_RT, positions=batch.positions_RT, segment_ids=batch.segment_ids_RT,
                      subtree_end=batch.subtree_end_RT).items():
    fields[name][:rows, :length] = x
  for name, x in dict(pred_index=np.maximum(rk(batch.parent_index_RT), 0), targets=rk(batch.tokens_RT),
                      weight=rk(weight_RT), logp_rollout=rk(batch.rollout_logprobs_RT),
                      advantages=rk(batch.advantages_RT), returns=rk(batch.returns_RT)).items():
    fields[name][:rows] = x
  return _split(fields, micro_batches)
