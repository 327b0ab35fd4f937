"""A rollout's call-log writer that encodes each call's input once, incrementally, for engine and log.

A call's input (~20K ids for a Claude Code call) usually extends the previous call's input + output.
This writer (a `CallLogWriter`: same validation, same fsync) keeps, for the last few calls written, their
ids and the JSON text of them, and encodes a new input against the longest that is its prefix: the new
ids are turned into text once, the engine gets the cached text plus them, and the log line gets the
reference form (`input_ref` + `input_tail`, see `clawjax.calllog`) with only the new ids. A line is then
~2 KB instead of ~150 KB, which is what the fsync before each response's final event has to wait for,
and a rollout's log grows linearly instead of quadratically. Inputs that extend no cached call (a
subagent's first call, a compacted context) are written whole. Routes likewise: a call that refers to an
earlier one stores (in the sidecar) only the routes of the positions past what that call's routes cover.

The server calls `encode_ids` before it sends the engine `EncodedInput.engine_json`; once the output is
known it builds the line (`call_line`), hands it to a log thread to `append` (one writev, then fsync),
builds the cache entry of the new prefix (`cache_entry`) while the disk works, and `remember`s it once
the line is on disk: a later call never refers to a record that failed to be written.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Sequence

from clawjax.calllog import CallLogWriter, CallRecord, Line, ids_json, record_line
from clawjax.routes import RoutedExperts


@dataclasses.dataclass(frozen=True)
class EncodedInput:
  """A call's input ids, encoded for the engine request (`engine_json`: the whole array) and for the
  log line (`log_field`: `"input_ids":[...]` or `"input_ref":{...},"input_tail":[...]`). `routes_from`:
  the positions before it have routes in the log already (the referenced call's), so the call's record
  stores the routes of the later ones only, and an engine may be asked for those only."""
  engine_json: bytes
  log_field: bytes
  routes_from: int = 0


@dataclasses.dataclass(frozen=True)
class _Written:
  """A call already written: its ids (the record's own tuples, not copies) and their JSON texts.
  Tuples, not lists: the garbage collector stops tracking a tuple of ints after its first pass, while it
  would walk every element of these ~20K-id sequences (four per live rollout) in each full collection."""
  call_index: int
  input_ids: tuple[int, ...]
  output_ids: tuple[int, ...]
  input_json: bytes   # [...]: what the engine was sent
  output_text: bytes  # comma-joined, no brackets
  routes_end: int     # its routes (through its own reference) cover positions [0, routes_end)


def own_routes(routes: RoutedExperts | None, routes_from: int, computed: int) -> tuple[RoutedExperts | None, str | None]:
  """The routes a call's record stores, of positions [routes_from, computed), from the engine's `routes`
  (of [first, end)); or (None, why) when they cannot be: routes that do not reach `computed`
  (len(input) + len(output) - 1) or start past `routes_from`. Nothing fails: the call is logged without."""
  if routes is None:
    return None, None
  if routes.end != computed or routes.first > routes_from:
    return None, (f"the engine's routes cover positions [{routes.first}, {routes.end}), the record needs "
                  f"[{routes_from}, {computed})")
  held = routes.full()
  return RoutedExperts(routes_from, held[routes_from - routes.first:]), None


class RolloutLogWriter(CallLogWriter):

  def __init__(self, path: str | os.PathLike[str], cached_calls: int = 4, fsync: bool = True):
    super().__init__(path, fsync)
    # Most recently used last. More than one, so a rollout's interleaved main-agent and subagent calls
    # (and retries) all find their prefix.
    self._calls: list[_Written] = []
    self._cached_calls = cached_calls
    self._lock_calls = threading.Lock()

  def encode_ids(self, ids: Sequence[int], call_index: int) -> EncodedInput:
    """Encodes the input of call `call_index` (validating the ids not taken from a cached call). Pass a
    tuple where one exists (the server's record holds it): other sequences are copied to one."""
    with self._lock_calls:
      calls = sorted(self._calls, key=lambda c: len(c.input_ids) + len(c.output_ids), reverse=True)
    ids = tuple(ids)
    for c in calls:  # Longest first; two probes reject most candidates before the full compare.
      m = len(c.input_ids)
      n = m + len(c.output_ids)
      if 0 < m and n <= len(ids) and c.call_index < call_index and ids[m - 1] == c.input_ids[-1] \
          and ids[m // 2] == c.input_ids[m // 2] and ids[:m] == c.input_ids \
          and ids[m:n] == c.output_ids:
        # (The loader resolves references to earlier calls only.)
        tail = ids_json(ids, n)[1:-1]
        with self._lock_calls:  # Least recently used goes first: a prefix that keeps matching stays.
          i = next((i for i, other in enumerate(self._calls) if other is c), None)
          if i is not None:  # (Identity: `in` would compare 20K-id lists.)
            self._calls.append(self._calls.pop(i))
        parts = [memoryview(c.input_json)[:-1]]  # One copy of the cached text, into the new array.
        for more in (c.output_text, tail):
          if more:
            parts += (b",", more)
        return EncodedInput(
            b"".join((*parts, b"]")),
            b'"input_ref":{"call_index":%d,"length":%d},"input_tail":[%b]' % (c.call_index, n, tail),
            min(c.routes_end, n))
    engine = ids_json(ids)
    return EncodedInput(engine, b'"input_ids":' + engine)

  def write_call(self, record: CallRecord, encoded: EncodedInput | None = None) -> None:
    """Appends `record` (fsynced); `encoded` is `encode_ids(record.input_ids, record.call_index)` if
    already done."""
    if encoded is None:
      encoded = self.encode_ids(record.input_ids, record.call_index)
    self.append(self.call_line(record, encoded))
    self.remember(self.cache_entry(record, encoded))

  def call_line(self, record: CallRecord, encoded: EncodedInput) -> Line:
    """The validated line of `record`, for `append` (the server builds it on its event loop and appends
    it on a log thread, where only the write and the fsync happen)."""
    return record_line(record, f"{self.path}:<new call record>", encoded.log_field)

  def cache_entry(self, record: CallRecord, encoded: EncodedInput) -> _Written:
    """`record`'s input + output and their text: the likely prefix of the next call's input."""
    routes = record.routed_experts
    return _Written(record.call_index, tuple(record.input_ids), tuple(record.output_ids),
                    encoded.engine_json, ",".join(map(str, record.output_ids)).encode(),
                    0 if routes is None else routes.end)

  def remember(self, written: _Written) -> None:
    """Caches the entry of a record that is on disk."""
    with self._lock_calls:
      self._calls.append(written)
      del self._calls[:-self._cached_calls]

  def close(self) -> None:
    super().close()
    with self._lock_calls:
      self._calls.clear()
