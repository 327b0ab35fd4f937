"""A rollout's calls as one prefix tree: a compressed token trie, flattened for packing.

The trie keeps one numpy array of tokens per edge (a radix tree). Walking a sequence compares whole
runs of an edge at once, so reading a call costs O(its tokens) numpy work plus O(edges on its path)
Python steps: a 64K-token context read 30 times costs 30 vectorised passes, not a quadratic scan.

Sampled tokens: each trie token records which call sampled it (`owner`, -1 = context) and that call's
rollout log-prob. A later input that repeats an earlier output token for token merges into it (the token
stays sampled); an input that diverges inside an earlier output branches there (drift, counted by
filters.py). "Trained exactly once": if two kept calls sampled the same tokens from the same context
(an identical retry that was continued, or deterministic decoding), those tokens are one event in one
context, so the tree holds them once, owned by the earliest call (its log-prob is used); the later
call owns only what it sampled beyond the shared part. A call whose output only re-samples tokens that
were context of an earlier input (same prefix, same position) makes them sampled: they are its own draw.

Routes (clawjax.routes): a call that logged its engine's routed experts gives each trie token it computed
(every position of its sequence but the last) its route. A token several calls computed keeps the route
of the call that computed it first (the lowest call_index among the kept calls that hold one; routes a
later call repeats through its input_ref are the same array, not compared); a later call whose route for
it differs (as a set of experts per layer: engine nondeterminism, another batch, a prefix recomputed) is
counted in `CallTree.route_disagree` and changes nothing. Tokens no kept call computed with routes (a
call's last sampled token, calls of a backend that reports none) have none (`routed_T` False).
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from clawjax.calllog import CallRecord
from clawjax.routes import RoutedExperts

ROOT = 0


class Trie:
  """A radix trie over int32 token sequences; node 0 is the (empty) root.

  Node n owns edge tokens `tokens[n]` (its first token sits at depth `start[n]`). Splitting an edge
  creates a new *head* node, so a node id always keeps its end depth: ids returned as path end points
  stay valid as the trie grows.
  """

  def __init__(self):
    self.tokens: list[np.ndarray] = [np.zeros(0, np.int32)]
    self.owner: list[np.ndarray] = [np.zeros(0, np.int32)]
    self.logp: list[np.ndarray] = [np.zeros(0, np.float32)]
    self.start: list[int] = [0]
    self.parent: list[int] = [-1]
    self.children: list[dict[int, int]] = [{}]
    # Routes per node: [len, layers, top_k] (None until a call gives one of its tokens a route), and which
    # source array each token's route came from (-1: none): a call repeating an earlier call's array is
    # not compared with it.
    self.routes: list[np.ndarray | None] = [None]
    self.route_src: list[np.ndarray] = [np.zeros(0, np.int32)]
    self.route_disagree = 0
    self._sources: dict[int, int] = {}
    self._owners: list[RoutedExperts] = []  # (keeps each source's id() its own)

  def end(self, n: int) -> int:
    return self.start[n] + len(self.tokens[n])

  def _new(self, parent: int, start: int, tokens: np.ndarray, owner: np.ndarray, logp: np.ndarray) -> int:
    n = len(self.tokens)
    self.tokens.append(tokens)
    self.owner.append(owner)
    self.logp.append(logp)
    self.start.append(start)
    self.parent.append(parent)
    self.children.append({})
    self.routes.append(None)
    self.route_src.append(np.full(len(tokens), -1, np.int32))
    if len(tokens):
      self.children[parent][int(tokens[0])] = n
    return n

  def _split(self, n: int, k: int) -> int:
    """Cuts node n after its first k tokens (0 < k < len); returns the new head node."""
    t, o, l = self.tokens[n], self.owner[n], self.logp[n]
    head = self._new(self.parent[n], self.start[n], t[:k], o[:k], l[:k])
    self.tokens[n], self.owner[n], self.logp[n] = t[k:], o[k:], l[k:]
    r, src = self.routes[n], self.route_src[n]
    self.routes[head], self.route_src[head] = (None if r is None else r[:k]), src[:k]
    self.routes[n], self.route_src[n] = (None if r is None else r[k:]), src[k:]
    self.start[n] += k
    self.parent[n] = head
    self.children[head][int(t[k])] = n
    return head

  def _match(self, child: int, seq: np.ndarray, pos: int) -> int:
    """How many tokens of `child`'s edge `seq[pos:]` repeats (one vectorised comparison)."""
    edge = self.tokens[child]
    k = min(len(edge), len(seq) - pos)
    diff = np.flatnonzero(edge[:k] != seq[pos:pos + k])
    return int(diff[0]) if len(diff) else k

  def walk(self, seq: np.ndarray) -> tuple[list[int], int]:
    """Follows `seq` from the root: (nodes whose whole edge it matched, in order; tokens matched)."""
    full: list[int] = []
    node, pos = ROOT, 0
    while pos < len(seq):
      child = self.children[node].get(int(seq[pos]))
      if child is None:
        break
      k = self._match(child, seq, pos)
      pos += k
      if k < len(self.tokens[child]):
        break
      full.append(child)
      node = child
    return full, pos

  def insert(self, seq: np.ndarray, cuts: Sequence[int] = (), owner: int = -1,
             sampled_from: int | None = None, logprobs: np.ndarray | None = None,
             routes: RoutedExperts | None = None) -> list[int]:
    """Adds `seq` as a root-to-node path; returns the node ending exactly at each depth in `cuts`.

    Tokens at depth >= `sampled_from` were sampled by call `owner` with `logprobs`: they become owned
    by it where the trie holds them as context (earlier owners are kept: see the module docstring).
    `routes`: the call's routes of positions of `seq` (the first route of a token is kept, see there).
    """
    seq = np.asarray(seq, np.int32)
    bounds = sorted({c for c in cuts if 0 < c <= len(seq)})
    segments = [] if routes is None else [(s.start, s.ids_PLK, self._source(s.owner)) for s in routes.segments()]
    node, pos = ROOT, 0
    while pos < len(seq):
      child = self.children[node].get(int(seq[pos]))
      if child is None:
        own = np.full(len(seq) - pos, -1, np.int32)
        lp = np.zeros(len(seq) - pos, np.float32)
        node = self._new(node, pos, seq[pos:].copy(), own, lp)
        self._claim(node, pos, sampled_from, owner, logprobs)
        self._claim_routes(node, pos, segments)
        pos = len(seq)
        break
      k = self._match(child, seq, pos)
      if k < len(self.tokens[child]):
        self._split(child, k)
        node = self.parent[child]
      else:
        node = child
      self._claim(node, pos, sampled_from, owner, logprobs)
      self._claim_routes(node, pos, segments)
      pos += k
    # Cut the path so that every requested depth is a node end.
    ends = {}
    path = self.path_nodes(node)
    for b in bounds:
      n = next(m for m in path if self.end(m) >= b)
      if self.end(n) > b:
        head = self._split(n, b - self.start[n])
        path.insert(path.index(n), head)
        n = head
      ends[b] = n
    return [ends[c] if 0 < c <= len(seq) else ROOT for c in cuts]

  def _claim(self, node: int, pos: int, sampled_from: int | None, owner: int,
             logprobs: np.ndarray | None) -> None:
    if sampled_from is None:
      return
    lo = max(sampled_from - pos, 0)
    if lo >= len(self.tokens[node]):
      return
    o = self.owner[node][lo:]
    take = o < 0
    o[take] = owner
    src = logprobs[pos + lo - sampled_from: pos + lo - sampled_from + len(o)]
    self.logp[node][lo:][take] = src[take]

  def _source(self, owner: RoutedExperts) -> int:
    if id(owner) not in self._sources:
      self._sources[id(owner)] = len(self._owners)
      self._owners.append(owner)
    return self._sources[id(owner)]

  def _claim_routes(self, node: int, pos: int, segments: list[tuple[int, np.ndarray, int]]) -> None:
    """Gives the node's tokens (positions pos.. of the inserted sequence) the routes `segments` hold for
    them where they have none; counts those whose route differs from the one they have."""
    n = len(self.tokens[node])
    for start, ids_PLK, src in segments:
      lo, hi = max(start, pos), min(start + len(ids_PLK), pos + n)
      if lo >= hi:
        continue
      new_PLK = ids_PLK[lo - start:hi - start]
      routes = self.routes[node]
      if routes is None or routes.shape[1:] != new_PLK.shape[1:] or routes.dtype.itemsize < new_PLK.dtype.itemsize:
        routes = self._route_array(node, new_PLK)
      have_P, mine_PLK = self.route_src[node][lo - pos:hi - pos], routes[lo - pos:hi - pos]
      empty_P = have_P < 0
      other_P = ~empty_P & (have_P != src)
      if other_P.any():
        differ = np.any(np.sort(mine_PLK[other_P], -1) != np.sort(new_PLK[other_P], -1), axis=(1, 2))
        self.route_disagree += int(differ.sum())
      mine_PLK[empty_P] = new_PLK[empty_P]
      have_P[empty_P] = src

  def _route_array(self, node: int, like_PLK: np.ndarray) -> np.ndarray:
    """The node's routes array, made (or widened) to hold routes like `like_PLK`; [layers, top_k] must
    agree with what it holds."""
    n, old = len(self.tokens[node]), self.routes[node]
    if old is not None and old.shape[1:] != like_PLK.shape[1:]:
      raise ValueError(f"routes of [layers, top_k] {like_PLK.shape[1:]} and {old.shape[1:]} in one rollout")
    dtype = like_PLK.dtype if old is None else np.promote_types(old.dtype, like_PLK.dtype)
    self.routes[node] = np.zeros((n, *like_PLK.shape[1:]), dtype)
    if old is not None:
      self.routes[node][:] = old
    return self.routes[node]

  def path_nodes(self, node: int) -> list[int]:
    """Nodes from the root's first child down to `node`."""
    out = []
    while node != ROOT:
      out.append(node)
      node = self.parent[node]
    return out[::-1]


@dataclasses.dataclass
class CallTree:
  """One rollout's kept calls as a prefix tree, flattened in depth-first pre-order (suffix _T).

  The subtree of token i is [i, subtree_end_T[i]); its tree parent is parent_T[i] (-1 for the first
  token). Nodes (suffix _K) are the radix edges: token ranges [node_start_K, node_end_K).
  """
  rollout_id: str
  tokens_T: np.ndarray       # int32
  depth_T: np.ndarray        # int32 depth (root token = 0): the RoPE position
  parent_T: np.ndarray       # int32
  subtree_end_T: np.ndarray  # int32
  owner_T: np.ndarray        # int32 call_index of the kept call that sampled the token; -1 = context
  logprobs_T: np.ndarray     # float32 that call's rollout log-prob; 0 on context
  paths_T: np.ndarray        # int32 number of root-to-leaf paths through the token
  node_start_K: np.ndarray   # int32
  node_end_K: np.ndarray     # int32
  node_parent_K: np.ndarray  # int32 (-1 for top-level nodes)
  leaves_L: np.ndarray       # int32 node index of each leaf, in pre-order
  # The engine's routes of each token, [T, layers, top_k] (see the module docstring), or None when no kept
  # call logged any; routed_T: which tokens have one (None: none has).
  routes_TLK: np.ndarray | None = None
  routed_T: np.ndarray | None = None
  route_disagree: int = 0    # tokens whose route a later kept call gave differently

  @property
  def size(self) -> int:
    return len(self.tokens_T)

  @property
  def loss_tokens(self) -> int:
    """Tokens the loss trains on: those a kept call sampled (owner_T >= 0), each once."""
    return int((self.owner_T >= 0).sum())

  def path(self, leaf: int) -> np.ndarray:
    """Token indices of the root-to-leaf path ending at node `leaf`."""
    chain = []
    while leaf >= 0:
      chain.append(np.arange(self.node_start_K[leaf], self.node_end_K[leaf], dtype=np.int32))
      leaf = int(self.node_parent_K[leaf])
    return np.concatenate(chain[::-1]) if chain else np.zeros(0, np.int32)

  def path_tokens(self) -> int:
    return int(sum(self.depth_T[self.node_end_K[l] - 1] + 1 for l in self.leaves_L))


CallArrays = tuple[np.ndarray, np.ndarray]


def call_arrays(call: CallRecord) -> CallArrays:
  """A call's input + output as one int32 array, and its output log-probs as float32."""
  # array.array converts a tuple of ints ~1.6x faster than np.array: this is most of the build time.
  seq = np.frombuffer(array.array("i", call.input_ids + call.output_ids), np.int32)
  return seq, np.array(call.output_logprobs, np.float32)


def build_tree(rollout_id: str, calls: Sequence[CallRecord],
               arrays: Mapping[int, CallArrays] | None = None) -> CallTree:
  """The prefix tree of `calls` (the kept calls of one rollout, in arrival order).

  `arrays`: `call_arrays` of each call by call_index, when the caller already has them.
  """
  trie = Trie()
  for c in sorted(calls, key=lambda c: c.call_index):
    seq, lp = arrays[c.call_index] if arrays is not None else call_arrays(c)
    trie.insert(seq, owner=c.call_index, sampled_from=len(c.input_ids), logprobs=lp, routes=c.routed_experts)
  return flatten(rollout_id, trie)


def flatten(rollout_id: str, trie: Trie) -> CallTree:
  """Lays the trie out in depth-first pre-order; children in insertion order."""
  order: list[int] = []
  stack = list(reversed(trie.children[ROOT].values()))
  while stack:
    n = stack.pop()
    order.append(n)
    stack.extend(reversed(trie.children[n].values()))
  k_of = {n: k for k, n in enumerate(order)}
  lengths = np.array([len(trie.tokens[n]) for n in order], np.int64)
  node_start = (np.cumsum(lengths) - lengths).astype(np.int32)
  node_end = (node_start + lengths).astype(np.int32)
  node_parent = np.array([k_of.get(trie.parent[n], -1) for n in order], np.int32)
  n_nodes = len(order)
  # Subtree end and path count of each node, children before parents (reverse pre-order).
  sub_end = node_end.copy()
  n_paths = np.zeros(n_nodes, np.int32)
  is_leaf = np.array([not trie.children[n] for n in order], bool)
  n_paths[is_leaf] = 1
  for k in range(n_nodes - 1, -1, -1):
    p = node_parent[k]
    if p >= 0:
      sub_end[p] = max(sub_end[p], sub_end[k])
      n_paths[p] += n_paths[k]
  total = int(lengths.sum())
  def per_token(values: np.ndarray) -> np.ndarray:
    return np.repeat(values, lengths).astype(values.dtype)
  idx = np.arange(total, dtype=np.int32)
  node_of = per_token(np.arange(n_nodes, dtype=np.int32))
  first = idx == per_token(node_start)
  parent = idx - 1
  parent_node = node_parent[node_of]
  parent[first] = np.where(parent_node[first] >= 0, node_end[np.maximum(parent_node[first], 0)] - 1, -1)
  depth = idx - per_token(node_start) + per_token(np.array([trie.start[n] for n in order], np.int32))
  cat = lambda arrs, dt: np.concatenate(arrs).astype(dt) if arrs else np.zeros(0, dt)
  routed = cat([trie.route_src[n] >= 0 for n in order], bool)
  routes = None
  if routed.any():
    like = next(trie.routes[n] for n in order if trie.routes[n] is not None)
    dtype = np.result_type(*(trie.routes[n] for n in order if trie.routes[n] is not None))
    routes = np.concatenate([trie.routes[n] if trie.routes[n] is not None
                             else np.zeros((len(trie.tokens[n]), *like.shape[1:]), dtype) for n in order]).astype(dtype)
  return CallTree(
      rollout_id=rollout_id,
      tokens_T=cat([trie.tokens[n] for n in order], np.int32),
      depth_T=depth.astype(np.int32), parent_T=parent.astype(np.int32),
      subtree_end_T=per_token(sub_end).astype(np.int32),
      owner_T=cat([trie.owner[n] for n in order], np.int32),
      logprobs_T=cat([trie.logp[n] for n in order], np.float32),
      paths_T=per_token(n_paths).astype(np.int32),
      node_start_K=node_start, node_end_K=node_end, node_parent_K=node_parent,
      leaves_L=np.flatnonzero(is_leaf).astype(np.int32),
      routes_TLK=routes, routed_T=routed if routes is not None else None, route_disagree=trie.route_disagree)
