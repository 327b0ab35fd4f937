"""Brute-force references for the tree tests: an uncompressed dict trie and O(n^2) relations."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from clawjax.calllog import CallRecord
from clawjax.tree import synthetic


def make_call(i: int, inp: list[int], out: list[int], role: str | None = "main",
              status: str = "ok") -> CallRecord:
  """A hand-written call of rollout "r" with distinct log-probs per call and position."""
  return CallRecord(rollout_id="r", task_id="t", harness="h", call_index=i, status=status,
                    input_ids=tuple(inp), output_ids=tuple(out),
                    output_logprobs=tuple(-0.1 * (i + 1) - 0.01 * k for k in range(len(out))),
                    role=role, finish_reason="stop", model="m", t_start=0.0, t_end=1.0)


class NaiveTrie:
  """One node per token: node ids for every prefix, owner (earliest sampler) and log-prob."""

  def __init__(self, calls: list[CallRecord]):
    self.child: dict[tuple[int, int], int] = {}
    self.depth: list[int] = [-1]
    self.owner: list[int] = [-1]
    self.logp: list[float] = [0.0]
    self.n_children: list[int] = [0]
    self.parent: list[int] = [-1]
    self.path_node: dict[int, int] = {}  # call_index -> node of its whole input + output
    for c in sorted(calls, key=lambda c: c.call_index):
      node = 0
      seq = c.input_ids + c.output_ids
      for k, tok in enumerate(seq):
        nxt = self.child.get((node, tok))
        if nxt is None:
          nxt = self.child[(node, tok)] = len(self.depth)
          self.depth.append(k)
          self.owner.append(-1)
          self.logp.append(0.0)
          self.n_children.append(0)
          self.parent.append(node)
          self.n_children[node] += 1
        node = nxt
        j = k - len(c.input_ids)
        if j >= 0 and self.owner[node] < 0:
          self.owner[node], self.logp[node] = c.call_index, c.output_logprobs[j]
      self.path_node[c.call_index] = node

  @property
  def size(self) -> int:
    return len(self.depth) - 1

  def leaves(self) -> list[int]:
    return [n for n in range(1, len(self.depth)) if self.n_children[n] == 0]

  def paths_through(self) -> np.ndarray:
    """Number of leaves below (or at) each node."""
    count = np.zeros(len(self.depth), np.int64)
    for leaf in self.leaves():
      n = leaf
      while n > 0:
        count[n] += 1
        n = self.parent[n]
    return count


def tree_to_naive(tokens: np.ndarray, parent: np.ndarray, naive: NaiveTrie) -> np.ndarray:
  """The naive node of each tree token, following the tree's own parent links (-1 if missing)."""
  out = np.full(len(tokens), -1, np.int64)
  for i in range(len(tokens)):
    up = 0 if parent[i] < 0 else out[parent[i]]
    out[i] = naive.child.get((int(up), int(tokens[i])), -1) if up >= 0 else -1
  return out


def ancestor_matrix(parent: np.ndarray) -> np.ndarray:
  """A[i, j]: j is an ancestor-or-self of i, by following parent links (parents precede children)."""
  n = len(parent)
  anc = np.zeros((n, n), bool)
  for i in range(n):
    if parent[i] >= 0:
      assert parent[i] < i
      anc[i] = anc[parent[i]]
    anc[i, i] = True
  return anc


def context_of(tokens: np.ndarray, parent: np.ndarray, i: int) -> tuple[int, ...]:
  """Tokens from the root down to i's parent."""
  out = []
  j = parent[i]
  while j >= 0:
    out.append(int(tokens[j]))
    j = parent[j]
  return tuple(reversed(out))


def rollouts(**kwargs):
  """Small synthetic rollouts (their calls) with a random subset of the harness patterns."""
  return patterned_rollouts(**kwargs).map(lambda pc: pc[1])


@st.composite
def patterned_rollouts(draw, *, vocab_size: int = 32000, max_calls: int = 8,
                       label_roles: bool | None = None):
  """(patterns, calls) of a small synthetic rollout."""
  patterns = tuple(p for p in synthetic.PATTERNS if draw(st.booleans()))
  seed = draw(st.integers(0, 2**32 - 1))
  labelled = draw(st.booleans()) if label_roles is None else label_roles
  return patterns, synthetic.agent_rollout(
      np.random.default_rng(seed), rollout_id=f"r{seed}", task_id="t", harness="h",
      prompt_len=draw(st.integers(4, 40)), n_calls=draw(st.integers(1, max_calls)),
      tokens_per_call=draw(st.integers(8, 30)), patterns=patterns, vocab_size=vocab_size,
      label_roles=labelled)
