"""Learner test helpers: a very small real Decoder, pytree comparison, and hand-built PackedBatches
(random token trees in tree and paths layouts).

Built here from first principles (not with clawjax.tree.pack) so the learner is checked against the
batch.py contract itself: a tree is a parent array in depth-first pre-order; each root-to-leaf path is a
plain causal sequence in the paths layout.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.tree.batch import PackedBatch

# One layer and a 256-token vocab keep every jit compile to seconds on 2 shared cores.
TINY = PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=256)


def make_policy(seed: int = 0) -> Decoder:
  return Decoder(TINY, rngs=nnx.Rngs(seed))


def rel_diff(a, b) -> float:
  """max |a - b| / max |b| over all leaves of two pytrees (global relative error)."""
  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(a))]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(b))]
  assert len(la) == len(lb)
  num = max(float(np.max(np.abs(x - y))) for x, y in zip(la, lb))
  den = max(float(np.max(np.abs(y))) for y in lb)
  return num / den


@dataclasses.dataclass
class Tree:
  parent: np.ndarray      # [n] pre-order parent (-1 at the root)
  tokens: np.ndarray      # [n]
  trained: np.ndarray     # [n] bool
  logp_rollout: np.ndarray
  advantage: float
  reward: float
  baseline: float = 0.0  # the group's mean reward (Dr. GRPO's advantage is reward - baseline)

  def depth(self) -> np.ndarray:
    d = np.zeros(len(self.parent), np.int32)
    for i in range(1, len(d)):
      d[i] = d[self.parent[i]] + 1
    return d

  def subtree_end(self) -> np.ndarray:
    end = np.arange(1, len(self.parent) + 1, dtype=np.int32)
    for i in range(len(end) - 1, 0, -1):
      end[self.parent[i]] = max(end[self.parent[i]], end[i])
    return end

  def paths(self) -> list[list[int]]:
    has_child = np.zeros(len(self.parent), bool)
    has_child[self.parent[1:]] = True
    out = []
    for leaf in np.nonzero(~has_child)[0]:
      path, i = [], int(leaf)
      while i >= 0:
        path.append(i)
        i = int(self.parent[i])
      out.append(path[::-1])
    return out


def random_tree(rng: np.random.Generator, n: int, vocab: int, branch_p: float = 0.08) -> Tree:
  """Pre-order tree: each node hangs under the previous node or, with branch_p, under an ancestor."""
  parent = np.full(n, -1, np.int32)
  stack = [0]
  for i in range(1, n):
    if rng.random() < branch_p and len(stack) > 1:
      del stack[int(rng.integers(1, len(stack))):]
    parent[i] = stack[-1]
    stack.append(i)
  trained = rng.random(n) < 0.6
  trained[0] = False
  return Tree(parent, rng.integers(1, vocab, n).astype(np.int32), trained,
              np.where(trained, -rng.random(n) * 8, 0).astype(np.float32),
              float(rng.normal()), float(rng.random()))


def _empty(rows: int, length: int) -> dict[str, np.ndarray]:
  z = lambda dt: np.zeros((rows, length), dt)
  return dict(tokens_RT=z(np.int32), positions_RT=z(np.int32), parent_index_RT=np.full((rows, length), -1, np.int32),
              subtree_end_RT=np.broadcast_to(np.arange(1, length + 1, dtype=np.int32), (rows, length)).copy(),
              segment_ids_RT=z(np.int32), unique_weight_RT=z(np.float32), path_weight_RT=z(np.float32),
              rollout_logprobs_RT=z(np.float32), advantages_RT=z(np.float32), returns_RT=z(np.float32),
              baselines_RT=z(np.float32),
              rollout_index_RT=np.full((rows, length), -1, np.int32))


def _finish(a: dict, trees: list[Tree]) -> PackedBatch:
  return PackedBatch(**a, rollout_ids_N=[f"r{i}" for i in range(len(trees))],
                     group_ids_N=np.zeros(len(trees), np.int32),
                     rewards_N=np.array([t.reward for t in trees], np.float32))


def _place(a: dict, row: int, start: int, seg: int, r: int, tree: Tree, nodes: list[int], parent_local: np.ndarray,
           depth: np.ndarray, end_local: np.ndarray, unique_w: np.ndarray, path_w: np.ndarray) -> None:
  sl = slice(start, start + len(nodes))
  a["tokens_RT"][row, sl] = tree.tokens[nodes]
  a["positions_RT"][row, sl] = depth
  a["parent_index_RT"][row, sl] = np.where(parent_local >= 0, parent_local + start, -1)
  a["subtree_end_RT"][row, sl] = end_local + start
  a["segment_ids_RT"][row, sl] = seg
  a["unique_weight_RT"][row, sl] = unique_w
  a["path_weight_RT"][row, sl] = path_w
  a["rollout_logprobs_RT"][row, sl] = tree.logp_rollout[nodes]
  trained = tree.trained[nodes]
  a["advantages_RT"][row, sl] = np.where(trained, tree.advantage, 0)
  a["returns_RT"][row, sl] = np.where(trained, tree.reward, 0)
  a["baselines_RT"][row, sl] = np.where(trained, tree.baseline, 0)
  a["rollout_index_RT"][row, sl] = r


def tree_layout(trees: list[Tree], rows: int, length: int) -> PackedBatch:
  """Trees dealt round-robin over rows, several per row as segments."""
  a = _empty(rows, length)
  fill, seg = [0] * rows, [0] * rows
  for r, tree in enumerate(trees):
    row = r % rows
    n = len(tree.parent)
    through = np.zeros(n, np.float32)
    for p in tree.paths():
      through[p] += 1
    seg[row] += 1
    _place(a, row, fill[row], seg[row], r, tree, list(range(n)), tree.parent, tree.depth(), tree.subtree_end(),
           tree.trained.astype(np.float32), np.where(tree.trained, through, 0))
    fill[row] += n
    assert fill[row] <= length, "trees do not fit the row"
  return _finish(a, trees)


def paths_layout(trees: list[Tree], length: int) -> PackedBatch:
  """Every root-to-leaf path its own causal row (one segment each)."""
  paths = [(r, tree, path) for r, tree in enumerate(trees) for path in tree.paths()]
  a = _empty(len(paths), length)
  seen = {r: np.zeros(len(tree.parent), bool) for r, tree in enumerate(trees)}
  for row, (r, tree, path) in enumerate(paths):
    n = len(path)
    assert n <= length, "a path does not fit the row"
    first = tree.trained[path] & ~seen[r][path]
    seen[r][path] = True
    _place(a, row, 0, 1, r, tree, path, np.arange(-1, n - 1), np.arange(n), np.full(n, n),
           first.astype(np.float32), tree.trained[path].astype(np.float32))
  return _finish(a, trees)



def stack_rows(rows: list[tuple[PackedBatch, int] | None], length: int) -> PackedBatch:
  """A batch of the given rows ((batch, row index) in order; None: an empty row), each padded to `length`.
  The per-rollout tables are left empty: the learner reads only the row arrays."""
  a = _empty(len(rows), length)
  for i, row in enumerate(rows):
    if row is not None:
      batch, r = row
      for name in a:
        a[name][i, :batch.shape[1]] = getattr(batch, name)[r]
  return PackedBatch(**a, rollout_ids_N=[], group_ids_N=np.zeros(0, np.int32), rewards_N=np.zeros(0, np.float32))
