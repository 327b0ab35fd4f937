"""PackedBatch -> the arrays one train step consumes: rows laid out in micro-batches, loss tokens compacted.

The vocab projection is the learner's largest activation (64K tokens x 151K vocab), so it is only done
for trained tokens: each row lists its loss tokens in K slots (`pred_index` = the parent whose hidden
state predicts the token), padded with weight 0.

Aggregation (`aggregation_weights`): each slot carries `weight` a_t and `norm` n_t, and the batch's loss is
sum_t a_t loss_t / sum_t n_t over the (mini)batch's slots; its metrics are a-weighted means. Per
aggregation (u_t: 1 on a trained token, p_t: the kept paths through it, U_i: the trained tokens of
rollout i, L: aggregation_tokens):
  token     a = u,      n = u         (the mean over trained tokens)
  paths     a = p,      n = p         (the mean over every path's tokens)
  rollout   a = u / U_i, n = u / U_i  (each rollout's token mean, then the mean over rollouts)
  constant  a = u / L,  n = u / U_i   (each rollout's token sum / L, then the mean over rollouts)
n sums to the rollouts of a batch for the last two, so minibatches and micro-batches add up as before.
The slots also carry the rollout structure a sequence-level loss reads (clawjax.rl.losses.rollout_mean):
u_t, p_t and `rollout`, the index of the token's rollout among its row's.

Rows are laid out by `RowLayout`: a global batch is every process's rows (one process: the batch's own),
cut into `minibatches` runs, each process's rows split evenly over them in order; minibatch k is the
micro-batches k x M/minibatches .. (k+1) x M/minibatches - 1, over every row shard. Only then are the
slots padded with empty rows, to a whole number per micro-batch and row shard. So which rows form a
minibatch depends on the rows and `minibatches` only, never on `micro_batches` or the row shards (a memory
and a mesh setting). Shapes: [M, rows, T] and [M, rows, K], rows = row shards x rows per slot.

In a run of several processes each prepares only its own rows; the shapes must still agree, since the
processes' rows become one global array: `BatchShape` is what one process's batch needs, and
`agree_shapes` the layout and sizes every process pads to (every process's rows, the longest row and the
most loss slots any process needs, batch by batch; a process with fewer batches contributes none, its
slots all empty rows, `empty_batch`). Empty rows carry no weight, so they change neither the loss nor its
normaliser.

Routes (rollout routing replay, clawjax.models.routing): when a step replays, every batch carries each
token's expert ids of the policy's MoE layers [M, r, T, moe_layers, top_k] (uint8, or uint16 where an id
needs it: the same for every process, `BatchShape.route_bytes`) and `routed` [M, r, T], False where a
token has none (padding, a process's rows without routes). A step that does not replay has neither (None).
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
  weight: np.ndarray        # [M, r, K] float32 the aggregation weight a_t; 0 on empty slots
  norm: np.ndarray          # [M, r, K] float32 the token's share n_t of the loss normaliser
  logp_rollout: np.ndarray  # [M, r, K] float32
  advantages: np.ndarray    # [M, r, K] float32
  returns: np.ndarray       # [M, r, K] float32
  baselines: np.ndarray     # [M, r, K] float32 the mean reward of the rollout's group
  unique_weight: np.ndarray  # [M, r, K] float32 u_t
  path_weight: np.ndarray   # [M, r, K] float32 p_t
  rollout: np.ndarray       # [M, r, K] int32 the index of the token's rollout in its row; -1 on empty slots
  row_order: np.ndarray     # [M, r] int32 the row's place in `RowLayout.order`; -1 on padding rows
  routes: np.ndarray | None = None  # [M, r, T, moe_layers, top_k] uint8 / uint16 expert ids to replay
  routed: np.ndarray | None = None  # [M, r, T] bool: the token has a route


# Per step that replays: (moe_layers, top_k, bytes per id) of the batches' routes.
RouteLayout = tuple[int, int, int]


def aggregation_weights(batch: PackedBatch, aggregation: str, tokens: int | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
  """(a_RT, n_RT) of `aggregation` (the module docstring; `tokens`: L of "constant"). A rollout's U_i
  counts its trained tokens over the whole batch, also where its paths lie in several rows."""
  u, p = batch.unique_weight_RT.astype(np.float32), batch.path_weight_RT.astype(np.float32)
  if aggregation == "token":
    return u, u
  if aggregation == "paths":
    return p, p
  rollout = np.maximum(batch.rollout_index_RT, 0)
  per_rollout = np.bincount(rollout.reshape(-1), weights=u.reshape(-1))
  share = np.where(u > 0, u / np.maximum(per_rollout[rollout], 1.0), 0.0).astype(np.float32)
  if aggregation == "rollout":
    return share, share
  if aggregation == "constant":
    return (u / np.float32(tokens)).astype(np.float32), share
  raise ValueError(f"aggregation {aggregation!r} is not one of token, paths, rollout, constant")


def loss_slots_needed(batch: PackedBatch, chunk: int) -> int:
  """The most loss tokens in a row of `batch`, rounded up to a multiple of `chunk` (at least one chunk).
  A loss token is trained under either weighting (in the paths layout a token repeated on a later path
  has p = 1 and u = 0): every aggregation and rollout_mean weighting sees the same slots."""
  most = int(batch.loss_mask_RT().sum(axis=1).max(initial=0))
  return -(-max(most, 1) // chunk) * chunk


def process_share(rows: int, processes: int, process: int) -> int:
  """This process's share of a global batch of `rows` rows: rows / processes, the first rows % processes
  processes one more. Every process needs one: it feeds rows of its own data only."""
  if rows < processes:
    raise ValueError(f"a batch of {rows} rows cannot be shared by {processes} processes: each feeds rows of "
                     f"its own, so use at least {processes} rows")
  return rows // processes + (process < rows % processes)


@dataclasses.dataclass(frozen=True)
class RowLayout:
  """Where the rows of a global batch go. `counts`: the rows of each process (its own, in its order).
  Each process's rows are split evenly into `minibatches` runs (the first ones a row longer); the global
  order (`order`) is minibatch by minibatch, in a minibatch process by process. A minibatch's slots are
  its micro_batches / minibatches micro-batches x the process's row shards x `per_slot` rows; a process's
  rows fill them shard by shard, the rest are empty rows."""
  counts: tuple[int, ...]
  minibatches: int = 1
  micro_batches: int = 1
  local_shards: int = 1     # row shards per process (every process holds as many)

  def sizes(self, process: int) -> list[int]:
    """The rows of `process` in each minibatch."""
    n, b = self.counts[process], self.minibatches
    return [n // b + (k < n % b) for k in range(b)]

  @property
  def per_slot(self) -> int:
    """Rows of one micro-batch on one row shard: room for the most rows a process has in a minibatch."""
    most = max(max(self.sizes(p)) for p in range(len(self.counts)))
    slots = self.micro_batches // self.minibatches * self.local_shards
    return max(1, -(-most // slots))

  def slots(self, process: int) -> np.ndarray:
    """[M, local_shards x per_slot]: which of the process's rows each slot holds, -1 for an empty row."""
    micro, r = self.micro_batches // self.minibatches, self.per_slot
    out = np.full((self.micro_batches, self.local_shards * r), -1, np.int32)
    start = 0
    for k, size in enumerate(self.sizes(process)):
      j = np.arange(size)
      out[k * micro + (j // r) % micro, j // (micro * r) * r + j % r] = start + j
      start += size
    return out

  def order(self) -> list[np.ndarray]:
    """Per process, each of its rows' place in the global order (one process: 0, 1, 2, ...)."""
    sizes = np.array([self.sizes(p) for p in range(len(self.counts))], np.int64)  # [P, minibatches]
    first = (np.cumsum(sizes.T.reshape(-1)) - sizes.T.reshape(-1)).reshape(sizes.T.shape).T  # [P, minibatches]
    return [np.concatenate([first[p, k] + np.arange(sizes[p, k]) for k in range(self.minibatches)]).astype(np.int32)
            for p in range(len(self.counts))]


@dataclasses.dataclass(frozen=True)
class BatchShape:
  """What one process's batch needs: its `rows`, the row length T and the loss slots K per row."""
  rows: int
  length: int
  loss_slots: int
  route_bytes: int = 0      # bytes per expert id of its routes; 0: it carries none


def batch_shape(batch: PackedBatch, *, chunk: int = 512) -> BatchShape:
  rows, length = batch.shape
  route_bytes = 0 if batch.routes_RTLK is None else batch.routes_RTLK.dtype.itemsize
  return BatchShape(rows, length, loss_slots_needed(batch, chunk), route_bytes)


@dataclasses.dataclass(frozen=True)
class GlobalShape:
  """One batch of the global step: every process's rows (0 for a process without this batch), and the row
  length and loss slots every process pads to."""
  counts: tuple[int, ...]
  length: int
  loss_slots: int
  route_bytes: int = 0      # the widest any process's routes need; 0: no process has routes


def agree_shapes(per_process: Sequence[Sequence[BatchShape]]) -> list[GlobalShape]:
  """The global batches, given each process's own list: as many as the longest list, batch i as long and
  with as many loss slots as the largest batch i of any process."""
  count = max((len(shapes) for shapes in per_process), default=0)
  out = []
  for i in range(count):
    shapes = [shapes[i] for shapes in per_process if i < len(shapes)]
    out.append(GlobalShape(tuple(shapes[i].rows if i < len(shapes) else 0 for shapes in per_process),
                           max(s.length for s in shapes), max(s.loss_slots for s in shapes),
                           max(s.route_bytes for s in shapes)))
  return out


def _empty_rows(rows: int, length: int, loss_slots: int, routes: RouteLayout | None = None) -> dict[str, np.ndarray]:
  """The fields of `rows` empty rows: no segment, no loss slot (weight 0), each position its own subtree,
  no route."""
  rt = lambda: np.zeros((rows, length), np.int32)
  rk = lambda dtype: np.zeros((rows, loss_slots), dtype)
  out = dict(tokens=rt(), positions=rt(), segment_ids=rt(),
             subtree_end=np.broadcast_to(np.arange(1, length + 1, dtype=np.int32), (rows, length)).copy(),
             pred_index=rk(np.int32), targets=rk(np.int32), weight=rk(np.float32), norm=rk(np.float32),
             logp_rollout=rk(np.float32), advantages=rk(np.float32), returns=rk(np.float32),
             baselines=rk(np.float32), unique_weight=rk(np.float32), path_weight=rk(np.float32),
             rollout=rk(np.int32) - 1)
  if routes is not None:
    layers, top_k, nbytes = routes
    out.update(routes=np.zeros((rows, length, layers, top_k), {1: np.uint8, 2: np.uint16}[nbytes]),
               routed=np.zeros((rows, length), bool))
  return out


def _lay_out(fields: dict[str, np.ndarray], layout: RowLayout, process: int) -> DeviceBatch:
  """The process's rows (`fields`, one empty row appended) placed in its slots; empty rows elsewhere."""
  slots_MR = layout.slots(process)
  order = np.append(layout.order()[process], -1).astype(np.int32)
  return DeviceBatch(**{n: a[slots_MR] for n, a in fields.items()}, row_order=order[slots_MR])


def empty_batch(layout: RowLayout, process: int, length: int, loss_slots: int,
                routes: RouteLayout | None = None) -> DeviceBatch:
  """The process's slots of `layout`, all empty rows (what a process without rows for a batch contributes)."""
  if layout.counts[process]:
    raise ValueError(f"empty_batch: process {process} has {layout.counts[process]} rows in {layout}")
  return _lay_out(_empty_rows(1, length, loss_slots, routes), layout, process)


def _row_rollouts(batch: PackedBatch, mask_RT: np.ndarray, whole: bool) -> np.ndarray:
  """[R, T] each loss token's rollout as an index among its row's rollouts (-1 elsewhere). `whole`: a
  ValueError when a rollout's loss tokens lie in several rows (a sequence-level loss reduces within a row)."""
  out = np.full(batch.shape, -1, np.int32)
  rows_of: dict[int, int] = {}
  for r in range(batch.shape[0]):
    ids = batch.rollout_index_RT[r][mask_RT[r]]
    _, out[r][mask_RT[r]] = np.unique(ids, return_inverse=True)
    for i in np.unique(ids).tolist():
      if whole and rows_of.setdefault(i, r) != r:
        rid = batch.rollout_ids_N[i] if i < len(batch.rollout_ids_N) else i
        raise ValueError(f"rollout {rid!r} has loss tokens in rows {rows_of[i]} and {r}: a sequence-level loss "
                         "needs each rollout in one row, as the tree layout (pack_trees) keeps it")
  return out


def prepare_batch(batch: PackedBatch, layout: RowLayout, *, aggregation: str = "token",
                  aggregation_tokens: int | None = None, whole_rollouts: bool = False, chunk: int = 512,
                  process: int = 0, length: int | None = None, loss_slots: int | None = None,
                  routes: RouteLayout | None = None) -> DeviceBatch:
  """Compact `batch` (the rows of `process` in `layout`) and lay it out, each row padded to `length`
  tokens and `loss_slots` slots (default: the least it needs), weighted by `aggregation`. A length and
  slot count fixed across batches avoid a recompile per batch shape. `whole_rollouts`: refuse a batch
  whose rollout spans rows (for a sequence-level loss). `routes`: the step replays; the batch's routes_RTLK
  (of the policy's MoE layers, or None) go in that layout."""
  weight_RT, norm_RT = aggregation_weights(batch, aggregation, aggregation_tokens)
  mask_RT = batch.loss_mask_RT()
  if (mask_RT & (batch.parent_index_RT < 0)).any():
    r, t = np.argwhere(mask_RT & (batch.parent_index_RT < 0))[0]
    raise ValueError(f"PackedBatch: loss token at row {r}, position {t} has parent_index -1")
  rows, row_len = batch.shape
  counts = mask_RT.sum(axis=1)
  length = row_len if length is None else length
  k = loss_slots_needed(batch, chunk) if loss_slots is None else loss_slots
  if counts.max(initial=0) > k:
    raise ValueError(f"a row has {counts.max()} loss tokens, more than loss_slots={k}")
  if rows != layout.counts[process] or length < row_len:
    raise ValueError(f"a batch of {rows} rows x {row_len} tokens does not fit process {process}'s "
                     f"{layout.counts[process]} rows of {length} tokens in {layout}")

  idx = np.zeros((rows, k), np.int32)
  valid = np.zeros((rows, k), bool)
  for r in range(rows):
    (pos,) = np.nonzero(mask_RT[r])
    idx[r, :len(pos)] = pos
    valid[r, :len(pos)] = True

  def rk(x_RT: np.ndarray) -> np.ndarray:
    return np.where(valid, np.take_along_axis(x_RT, idx, axis=1), 0)

  fields = _empty_rows(rows + 1, length, k, routes)  # the last row stays empty: every padding slot's
  rt = dict(tokens=batch.tokens_RT, positions=batch.positions_RT, segment_ids=batch.segment_ids_RT,
            subtree_end=batch.subtree_end_RT)
  if routes is not None and batch.routes_RTLK is not None:
    rt.update(routes=batch.routes_RTLK, routed=batch.routed_RT)
  for name, x in rt.items():
    fields[name][:rows, :row_len] = x
  for name, x in dict(pred_index=np.maximum(rk(batch.parent_index_RT), 0), targets=rk(batch.tokens_RT),
                      weight=rk(weight_RT), norm=rk(norm_RT), logp_rollout=rk(batch.rollout_logprobs_RT),
                      advantages=rk(batch.advantages_RT), returns=rk(batch.returns_RT),
                      baselines=rk(batch.baselines_RT), unique_weight=rk(batch.unique_weight_RT),
                      path_weight=rk(batch.path_weight_RT)).items():
    fields[name][:rows] = x
  fields["rollout"][:rows] = np.where(valid, np.take_along_axis(_row_rollouts(batch, mask_RT, whole_rollouts), idx,
                                                                axis=1), -1)
  return _lay_out(fields, layout, process)
