"""Prefix reuse across calls: which token prefix each KV-cache slot still holds.

An agent's next call repeats ~99% of its previous call (input + output + the new tool result). The engine
keeps a finished sequence's keys/values in its slot; a new request goes to the free slot whose retained
tokens share the longest prefix with its input, and only the rest is prefilled. The cache's capacity is
the number of slots: a slot's prefix is forgotten when another request takes it, least recently used
first among slots that match nothing. An engine that records routed experts keeps each slot's routes
beside its tokens (`routes`), so a request that reuses a prefix reports the routes that computed it.
"""

from __future__ import annotations

import dataclasses

import numpy as np


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if len(diff) else n


@dataclasses.dataclass
class SlotPrefixCache:
  """Per slot: the tokens whose keys/values are valid at positions 0..len-1 of that slot."""
  num_slots: int

  def __post_init__(self):
    self._tokens: list[np.ndarray] = [np.zeros(0, np.int32) for _ in range(self.num_slots)]
    self._routes: list[np.ndarray | None] = [None] * self.num_slots
    self._last_use = [0] * self.num_slots
    self._clock = 0

  def cached(self, slot: int) -> np.ndarray:
    return self._tokens[slot]

  def routes(self, slot: int) -> np.ndarray | None:
    """The routes [len(cached), layers, top_k] that computed the slot's tokens (None: not recorded)."""
    return self._routes[slot]

  def choose(self, input_ids: np.ndarray, free_slots: list[int]) -> tuple[int, int]:
    """Returns (slot, reusable_len) for a new request among `free_slots` (non-empty).

    The longest match wins; without any match, the least recently used slot is overwritten.
    """
    if not free_slots:
      raise ValueError("choose: no free slot")
    matches = [(common_prefix_len(self._tokens[s], input_ids), -self._last_use[s], s) for s in free_slots]
    best_len, _, slot = max(matches)
    if best_len == 0:
      slot = min(free_slots, key=lambda s: self._last_use[s])
    return slot, best_len

  def set(self, slot: int, tokens: np.ndarray, routes: np.ndarray | None = None) -> None:
    """Records that the slot now holds valid keys/values for exactly `tokens`, computed with `routes`
    (one per token, or None)."""
    if routes is not None and len(routes) != len(tokens):
      raise ValueError(f"SlotPrefixCache.set: {len(routes)} routes for {len(tokens)} tokens")
    self._clock += 1
    self._last_use[slot] = self._clock
    self._tokens[slot] = np.asarray(tokens, np.int32)
    self._routes[slot] = routes

  def flush(self) -> None:
    """Forgets every prefix (after a weight update the cached keys/values are stale)."""
    self._tokens = [np.zeros(0, np.int32) for _ in range(self.num_slots)]
    self._routes = [None] * self.num_slots
