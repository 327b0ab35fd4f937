"""Slot choice of the prefix cache against a brute-force longest-common-prefix search."""

import numpy as np

from clawjax.engine.prefix_cache import SlotPrefixCache


def brute_lcp(a, b) -> int:
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return n


def test_choose_takes_the_longest_match_among_free_slots():
  rng = np.random.default_rng(0)
  for _ in range(200):
    cache = SlotPrefixCache(5)
    base = rng.integers(0, 3, 12)
    for slot in range(5):  # prefixes of a shared stem with random tails: many partial matches
      cut = int(rng.integers(0, 12))
      cache.set(slot, np.concatenate([base[:cut], rng.integers(0, 3, int(rng.integers(0, 5)))]))
    query = np.concatenate([base[:int(rng.integers(1, 12))], rng.integers(0, 3, 3)])
    free = sorted(rng.choice(5, size=int(rng.integers(1, 6)), replace=False).tolist())
    slot, n = cache.choose(query, free)
    best = max(brute_lcp(cache.cached(s), query) for s in free)
    assert slot in free and n == best == brute_lcp(cache.cached(slot), query)


def test_without_a_match_the_least_recently_used_slot_is_reused():
  cache = SlotPrefixCache(3)
  for slot, tokens in ((0, [1, 2]), (1, [3, 4]), (2, [5, 6])):
    cache.set(slot, np.array(tokens))
  cache.set(0, np.array([1, 2, 7]))  # slot 0 used again: slot 1 is now the oldest
  assert cache.choose(np.array([9, 9]), [0, 1, 2]) == (1, 0)
  cache.flush()
  assert cache.choose(np.array([1, 2]), [0, 1, 2])[1] == 0
