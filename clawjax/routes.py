"""Routed experts: the expert ids each MoE layer of an engine chose for each token position of a call.

A route array is [positions, layers, top_k] (suffix _PLK): row p holds, for every layer the engine
reports, the top_k experts it chose when it computed the token at position p of the call's sequence
(input ids, then output ids). An engine computes every position but the last sampled token's (that one
is never fed back), so a call's routes cover positions [0, len(input) + len(output) - 1): vLLM's and
SGLang's convention. `layers` is what the engine reports: the MoE layers only (clawjax's engine, vLLM),
or every decoder layer (SGLang, dense layers included); `moe_layers` picks the MoE ones.

Ids are held compactly: uint8 while every id is below 256 (n_experts <= 256, as Qwen3-30B-A3B's 128),
else uint16.

`RoutedExperts` holds the routes of positions [start, end) and, for positions before `start`, the routes
of an earlier call of the same rollout (`before`): a call that continues an earlier one carries only the
routes of its new positions, as the call log stores them. Without `before` it holds [start, end) only
(an engine asked for the positions past a prefix whose routes the caller has).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

ROUTE_DTYPES = ("uint8", "uint16")


def compact(ids: np.ndarray, where: str = "routed_experts") -> np.ndarray:
  """`ids` [positions, layers, top_k] in the narrowest of ROUTE_DTYPES; a negative id or one past uint16
  is a ValueError naming `where`."""
  ids = np.asarray(ids)
  if ids.ndim != 3:
    raise ValueError(f"{where}: expected [positions, layers, top_k], got shape {ids.shape}")
  if not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"{where}: expected integer expert ids, got {ids.dtype}")
  if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.uint16).max):
    raise ValueError(f"{where}: expert id {int(ids.min() if ids.min() < 0 else ids.max())} is outside "
                     f"[0, {np.iinfo(np.uint16).max}]")
  narrow = np.uint8 if not ids.size or ids.max() < 256 else np.uint16
  return ids if ids.dtype == narrow else ids.astype(narrow)


def moe_layers(ids_LK: np.ndarray, n_layers: int, moe: Sequence[int]) -> np.ndarray:
  """The MoE layers' routes of `ids_LK` ([..., layers, top_k]), whose layer axis holds either the `moe`
  layers already or all `n_layers` decoder layers (SGLang's form); anything else is a ValueError."""
  layers = ids_LK.shape[-2]
  if layers == len(moe):
    return ids_LK
  if layers == n_layers:
    return ids_LK[..., list(moe), :]
  raise ValueError(f"routes of {layers} layers, but the model has {n_layers} layers of which {len(moe)} are MoE")


class Segment(NamedTuple):
  """Routes of positions [start, start + len(ids_PLK)), a view of `owner`'s own array."""
  start: int
  ids_PLK: np.ndarray
  owner: RoutedExperts


@dataclasses.dataclass(frozen=True, eq=False)
class RoutedExperts:
  """The routes of positions [start, start + len(ids_PLK)); those before `start` are `before`'s (which
  reaches `start` at least), or not held. Equal when they hold the same routes for the same positions."""
  start: int
  ids_PLK: np.ndarray
  before: RoutedExperts | None = None

  def __post_init__(self):
    if self.start < 0 or self.ids_PLK.ndim != 3:
      raise ValueError(f"RoutedExperts: start {self.start}, shape {self.ids_PLK.shape}")
    if self.before is not None and self.before.end < self.start:
      raise ValueError(f"RoutedExperts: the earlier call's routes end at {self.before.end}, before {self.start}")
    if self.before is not None and self.before.ids_PLK.shape[1:] != self.ids_PLK.shape[1:]:
      raise ValueError(f"RoutedExperts: [layers, top_k] {self.ids_PLK.shape[1:]} differ from the earlier call's "
                       f"{self.before.ids_PLK.shape[1:]}")

  @property
  def end(self) -> int:
    return self.start + len(self.ids_PLK)

  @property
  def shape(self) -> tuple[int, int]:
    """(layers, top_k)."""
    return self.ids_PLK.shape[1], self.ids_PLK.shape[2]

  @property
  def first(self) -> int:
    """The first position held (0 unless the routes of a prefix were not asked for)."""
    return self.segments()[0].start if self.end else self.start

  def segments(self) -> list[Segment]:
    """The runs covering [first, end) in order, each a view of the array of the call that holds it."""
    out, hi, r = [], self.end, self
    while r is not None and hi > 0:
      if r.start < hi:
        out.append(Segment(r.start, r.ids_PLK[:hi - r.start], r))
        hi = r.start
      r = r.before
    return out[::-1]

  def full(self) -> np.ndarray:
    """The routes of every position held, [end - first, layers, top_k]."""
    parts = [s.ids_PLK for s in self.segments()]
    return np.concatenate(parts) if parts else self.ids_PLK[:0]

  def __eq__(self, other: object) -> bool:
    return (isinstance(other, RoutedExperts) and (self.first, self.end, self.shape) == (other.first, other.end, other.shape)
            and np.array_equal(self.full(), other.full()))

  def __hash__(self) -> int:
    return hash((self.first, self.end, self.shape))
