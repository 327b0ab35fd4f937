"""The call log: the record of every model call a harness made, and of each rollout's outcome.

This is the public boundary between serving (which writes it) and the learner (which reads it).
Format: JSON Lines. Each line is one object; its `schema` field says which record it is:

`clawjax.call/1` (one model call), required fields:
  rollout_id (str), task_id (str), harness (str), call_index (int >= 0, arrival order in the rollout),
  status ("ok" | "error"), input_ids (list[int]), output_ids (list[int]),
  output_logprobs (list[float], finite, same length as output_ids: the engine's log-prob of each sampled
  token under the distribution it sampled from), role ("main" | "compaction" | "subagent" |
  "auxiliary" | null = unknown), finish_reason (str | null), model (str), t_start, t_end (float, Unix s).
  Optional: policy_version (int | null: the weights version that sampled the call), extra (object:
  free-form diagnostics such as the API used, spliced or drifted turns, an error message).
  Instead of input_ids, a call may give input_ref {call_index, length} and input_tail (list[int]): its
  input is the first `length` ids of an earlier call of the same rollout in the same file (that call's
  input_ids, then its output_ids) followed by input_tail. The shim writes this form, so a rollout's log
  grows with each call's new tokens rather than with its whole context (quadratic over a long rollout).

  Optional: routed_experts {start, shape: [positions, layers, top_k], dtype: "uint8" | "uint16", offset,
  crc32}: the expert ids the engine's MoE layers chose (clawjax.routes) at positions [start, start +
  positions) of the call's input + output, which is every position but the last sampled token's
  (start + positions == len(input_ids) + len(output_ids) - 1). They are stored raw (little-endian, C
  order) in a binary sidecar beside the log, `<log file>.routes`, at byte `offset`, with the zlib CRC-32
  of those bytes: a rollout's routes cost their own bytes, ~1 byte per (token, layer, choice) while
  n_experts <= 256, with no base64 in the line. start > 0 only with input_ref: positions [0, start) are
  those of the referenced call (start <= length, and that call's routes reach start), so each token of a
  rollout the engine computed once is stored once. A log without the field (every log before it) loads
  as before, its calls without routes.

`clawjax.rollout/1` (one rollout's outcome), required fields:
  rollout_id, task_id, harness (str), reward (float | null; null when status is not "ok"),
  status ("ok" | "failed" | "timeout" | "error"). Optional: extra (object).

Calls and rollout records may share one file or live in separate files; a file may hold one rollout or
many. Loading validates every field: a bad line raises `CallLogError` naming file, line and field, or,
with `errors="collect"`, is reported in `LoadedLog.problems` and left out. Non-finite log-probs and
rewards are never accepted silently. Writers append one line per record and fsync it before returning,
so a crash loses at most the record being written; a call's routes are written and fsynced to the
sidecar before its line (routes of a line that never landed are unused bytes there, never read).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import orjson

from clawjax.routes import ROUTE_DTYPES, RoutedExperts, compact

CALL_SCHEMA = "clawjax.call/1"
ROLLOUT_SCHEMA = "clawjax.rollout/1"
ROLES = ("main", "compaction", "subagent", "auxiliary")
CALL_STATUSES = ("ok", "error")
MAX_TOKEN_ID = 2**31 - 1  # token ids are stored as int32 downstream
MAX_LOGPROB = 1e-6  # log-probs are <= 0; this much above is float rounding in the engine
ROLLOUT_STATUSES = ("ok", "failed", "timeout", "error")
ROUTES_SUFFIX = ".routes"  # the routes sidecar of a log file: `<log file>.routes`


class CallLogError(ValueError):
  """A record that does not follow the schema; the message names file, line and field."""

  def __init__(self, where: str, field: str | None, message: str):
    self.where, self.field, self.message = where, field, message
    super().__init__(f"{where}: field {field!r}: {message}" if field else f"{where}: {message}")


@dataclasses.dataclass(frozen=True)
class CallRecord:
  rollout_id: str
  task_id: str
  harness: str
  call_index: int
  status: str
  input_ids: tuple[int, ...]
  output_ids: tuple[int, ...]
  output_logprobs: tuple[float, ...]
  role: str | None
  finish_reason: str | None
  model: str
  t_start: float
  t_end: float
  policy_version: int | None = None
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
  # The engine's routes (see the module docstring); `routed_experts.before` is the referenced call's.
  routed_experts: RoutedExperts | None = None

  def to_json(self) -> dict[str, Any]:
    """The line's fields, without routed_experts (its routes live in the sidecar: `record_line`)."""
    d = _shallow_json(CALL_SCHEMA, self)
    d["input_ids"], d["output_ids"] = list(self.input_ids), list(self.output_ids)
    d["output_logprobs"] = list(self.output_logprobs)
    return d


@dataclasses.dataclass(frozen=True)
class InputRef:
  """A call's input as written in the log's reference form (see the module docstring)."""
  call_index: int
  length: int
  tail: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RoutesField:
  """A call's routed_experts field as its line gives it: where its routes lie in the sidecar."""
  start: int
  shape: tuple[int, int, int]
  dtype: str
  offset: int
  crc32: int

  @property
  def nbytes(self) -> int:
    return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class UnresolvedCall:
  """A parsed call in the reference form, or with routes: `record` lacks its input_ids until the
  referenced call is known, and its routes until the sidecar is read (`load` and `iter_records` resolve
  them per file)."""
  record: CallRecord
  input_ref: InputRef | None
  routes: RoutesField | None = None

  def resolve(self, earlier: CallRecord | None, sidecar: _Sidecar, where: str) -> CallRecord:
    """The full record, its input from `earlier` (the call input_ref names) and its routes from the sidecar;
    a CallLogError naming the field otherwise."""
    record = self.record
    if self.input_ref is not None:
      history = (*earlier.input_ids, *earlier.output_ids)
      if self.input_ref.length > len(history):
        raise CallLogError(where, "input_ref", f"length {self.input_ref.length} exceeds the {len(history)} input + "
                           f"output ids of call {earlier.call_index}")
      record = dataclasses.replace(record, input_ids=history[:self.input_ref.length] + self.input_ref.tail)
    if self.routes is None:
      return record
    try:
      return dataclasses.replace(record, routed_experts=self._routes(record, earlier, sidecar))
    except ValueError as e:
      raise CallLogError(where, "routed_experts", str(e)) from None

  def _routes(self, record: CallRecord, earlier: CallRecord | None, sidecar: _Sidecar) -> RoutedExperts:
    f = self.routes
    computed = max(len(record.input_ids) + len(record.output_ids) - 1, 0)
    if f.start + f.shape[0] != computed:
      raise ValueError(f"start {f.start} + {f.shape[0]} positions != the call's {computed} computed positions "
                       f"(input + output - 1)")
    before = None
    if f.start:
      before = earlier.routed_experts if self.input_ref is not None else None
      if before is None or f.start > self.input_ref.length or before.end < f.start:
        raise ValueError(f"start {f.start}: positions before it must be those of the call input_ref names, whose "
                         f"routes reach {f.start} (input_ref: {self.input_ref})")
    return RoutedExperts(f.start, sidecar.read(f), before)


@dataclasses.dataclass(frozen=True)
class RolloutRecord:
  rollout_id: str
  task_id: str
  harness: str
  reward: float | None
  status: str
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    return _shallow_json(ROLLOUT_SCHEMA, self)


def _shallow_json(schema: str, record: Any) -> dict[str, Any]:
  # Not dataclasses.asdict: it deep-copies every token tuple (tens of ms for a 24K-token call).
  d = {"schema": schema, **{f.name: getattr(record, f.name) for f in dataclasses.fields(record)
                            if f.name != "routed_experts"}}
  d["extra"] = copy.deepcopy(record.extra)
  return d


Record = CallRecord | RolloutRecord


def _is_int(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_token_id(v: Any) -> bool:
  """A valid token id: an int (not a bool) in [0, MAX_TOKEN_ID]."""
  return type(v) is int and 0 <= v <= MAX_TOKEN_ID  # pylint: disable=unidiomatic-typecheck


def is_logprob(v: Any) -> bool:
  """A valid sampled token's log-prob: a finite number <= MAX_LOGPROB."""
  return _is_number(v) and math.isfinite(v) and v <= MAX_LOGPROB


class _Fields:
  """Typed access to one JSON object's fields, raising CallLogError that names the field."""

  def __init__(self, obj: dict[str, Any], where: str):
    self.obj, self.where = obj, where

  def fail(self, field: str, message: str) -> CallLogError:
    return CallLogError(self.where, field, message)

  def get(self, field: str, *, optional: bool = False) -> Any:
    if field not in self.obj:
      if optional:
        return None
      raise self.fail(field, "missing")
    return self.obj[field]

  def string(self, field: str, *, nullable: bool = False, choices: tuple[str, ...] | None = None,
             optional: bool = False) -> str | None:
    v = self.get(field, optional=optional)
    if v is None and (nullable or optional):
      return None
    if not isinstance(v, str):
      raise self.fail(field, f"expected a string, got {type(v).__name__}")
    if choices is not None and v not in choices:
      raise self.fail(field, f"{v!r} is not one of {choices}")
    return v

  def integer(self, field: str, *, optional: bool = False, minimum: int | None = None) -> int | None:
    v = self.get(field, optional=optional)
    if v is None and optional:
      return None
    if not _is_int(v):
      raise self.fail(field, f"expected an integer, got {type(v).__name__}")
    if minimum is not None and v < minimum:
      raise self.fail(field, f"{v} is below {minimum}")
    return v

  def number(self, field: str, *, nullable: bool = False) -> float | None:
    v = self.get(field)
    if v is None and nullable:
      return None
    if not _is_number(v):
      raise self.fail(field, f"expected a number, got {type(v).__name__}")
    if not math.isfinite(v):
      raise self.fail(field, f"non-finite value {v}")
    return float(v)

  def token_ids(self, field: str) -> tuple[int, ...]:
    v = self.get(field)
    if not isinstance(v, list):
      raise self.fail(field, f"expected a list of token ids, got {type(v).__name__}")
    for i, t in enumerate(v):
      if not is_token_id(t):
        raise self.fail(field, f"element {i} is {t!r}, not an integer in [0, {MAX_TOKEN_ID}]")
    return tuple(v)

  def logprobs(self, field: str) -> tuple[float, ...]:
    v = self.get(field)
    if not isinstance(v, list):
      raise self.fail(field, f"expected a list of floats, got {type(v).__name__}")
    for i, x in enumerate(v):
      if not _is_number(x):
        raise self.fail(field, f"element {i} is {x!r}, not a number")
      if not is_logprob(x):
        raise self.fail(field, f"element {i} is {x}, not a finite log-probability")
    return tuple(float(x) for x in v)

  def input_ref(self, call_index: int) -> InputRef:
    v = self.get("input_ref")
    if not isinstance(v, dict) or set(v) != {"call_index", "length"}:
      raise self.fail("input_ref", f"expected {{call_index, length}}, got {str(v)[:100]}")
    k, n = v["call_index"], v["length"]
    if not _is_int(k) or not 0 <= k < call_index:
      raise self.fail("input_ref", f"call_index {k!r} is not an earlier call (below {call_index})")
    if not _is_int(n) or n < 0:
      raise self.fail("input_ref", f"length {n!r} is not a non-negative integer")
    return InputRef(k, n, self.token_ids("input_tail"))

  def routes(self) -> RoutesField | None:
    v = self.get("routed_experts", optional=True)
    if v is None:
      return None
    keys = {"start", "shape", "dtype", "offset", "crc32"}
    if not isinstance(v, dict) or set(v) != keys:
      raise self.fail("routed_experts", f"expected {{{', '.join(sorted(keys))}}}, got {str(v)[:100]}")
    shape = v["shape"]
    if not (isinstance(shape, list) and len(shape) == 3 and all(_is_int(n) and n >= 0 for n in shape)):
      raise self.fail("routed_experts", f"shape {shape!r} is not [positions, layers, top_k]")
    if v["dtype"] not in ROUTE_DTYPES:
      raise self.fail("routed_experts", f"dtype {v['dtype']!r} is not one of {ROUTE_DTYPES}")
    for key in ("start", "offset", "crc32"):
      if not _is_int(v[key]) or v[key] < 0:
        raise self.fail("routed_experts", f"{key} {v[key]!r} is not a non-negative integer")
    return RoutesField(v["start"], tuple(shape), v["dtype"], v["offset"], v["crc32"])

  def mapping(self, field: str) -> dict[str, Any]:
    v = self.get(field, optional=True)
    if v is None:
      return {}
    if not isinstance(v, dict):
      raise self.fail(field, f"expected an object, got {type(v).__name__}")
    return v


def parse_record(obj: Any, where: str) -> Record | UnresolvedCall:
  """Validates one decoded JSON object; `where` (e.g. "calls.jsonl:12") prefixes every error."""
  if not isinstance(obj, dict):
    raise CallLogError(where, None, f"expected a JSON object, got {type(obj).__name__}")
  f = _Fields(obj, where)
  schema = f.string("schema")
  if schema == CALL_SCHEMA:
    status = f.string("status", choices=CALL_STATUSES)
    output_ids = f.token_ids("output_ids")
    output_logprobs = f.logprobs("output_logprobs")
    if len(output_logprobs) != len(output_ids):
      raise f.fail("output_logprobs",
                   f"length {len(output_logprobs)} differs from output_ids length {len(output_ids)}")
    t_start, t_end = f.number("t_start"), f.number("t_end")
    call_index = f.integer("call_index", minimum=0)
    ref = None
    if "input_ref" in obj:
      if "input_ids" in obj:
        raise f.fail("input_ids", "given together with input_ref")
      ref = f.input_ref(call_index)
    routes = f.routes()
    record = CallRecord(
        rollout_id=f.string("rollout_id"), task_id=f.string("task_id"), harness=f.string("harness"),
        call_index=call_index, status=status,
        input_ids=() if ref else f.token_ids("input_ids"), output_ids=output_ids,
        output_logprobs=output_logprobs, role=f.string("role", nullable=True, choices=ROLES),
        finish_reason=f.string("finish_reason", nullable=True), model=f.string("model"),
        t_start=t_start, t_end=t_end,
        policy_version=f.integer("policy_version", optional=True), extra=f.mapping("extra"))
    return record if ref is None and routes is None else UnresolvedCall(record, ref, routes)
  if schema == ROLLOUT_SCHEMA:
    status = f.string("status", choices=ROLLOUT_STATUSES)
    reward = f.number("reward", nullable=True)
    if status == "ok" and reward is None:
      raise f.fail("reward", "null, but status is 'ok'")
    return RolloutRecord(
        rollout_id=f.string("rollout_id"), task_id=f.string("task_id"), harness=f.string("harness"),
        reward=reward, status=status, extra=f.mapping("extra"))
  raise f.fail("schema", f"unknown schema {schema!r} (expected {CALL_SCHEMA!r} or {ROLLOUT_SCHEMA!r})")


def _lines(path: str) -> Iterator[tuple[str, str]]:
  with open(path, encoding="utf-8") as fh:
    for lineno, line in enumerate(fh, start=1):
      if line.strip():
        yield f"{path}:{lineno}", line


def parse_line(line: str, where: str) -> Record | UnresolvedCall:
  # NaN / Infinity (non-standard JSON) parse to floats so the field check can name the field.
  try:
    obj = json.loads(line)
  except ValueError as e:
    raise CallLogError(where, None, f"invalid JSON ({e})") from None
  return parse_record(obj, where)


class _Sidecar:
  """A log file's routes sidecar, read whole on first use."""

  def __init__(self, path: str):
    self.path, self._data = path + ROUTES_SUFFIX, None

  def read(self, f: RoutesField) -> np.ndarray:
    if self._data is None:
      try:
        with open(self.path, "rb") as fh:
          self._data = fh.read()
      except OSError as e:
        raise ValueError(f"cannot read the routes sidecar: {e}") from None
    end = f.offset + f.nbytes
    if end > len(self._data):
      raise ValueError(f"bytes [{f.offset}, {end}) lie past the end of {self.path} ({len(self._data)} bytes)")
    raw = memoryview(self._data)[f.offset:end]
    if zlib.crc32(raw) != f.crc32:
      raise ValueError(f"bytes [{f.offset}, {end}) of {self.path} fail their CRC-32 (the sidecar is not this "
                       f"log's, or was damaged)")
    return np.frombuffer(raw, np.dtype(f.dtype).newbyteorder("<")).reshape(f.shape)


def _file_records(path: str) -> list[tuple[str, str, Record | CallLogError]]:
  """(where, line, record or its error) for each line of one file, in order, with every call in the
  reference form resolved against the file's other calls (a rollout's calls in call_index order, so a
  reference to a call that was itself a reference works) and its routes read from the sidecar."""
  parsed: list[tuple[str, str, Record | UnresolvedCall | CallLogError]] = []
  for where, line in _lines(path):
    try:
      parsed.append((where, line, parse_line(line, where)))
    except CallLogError as e:
      parsed.append((where, line, e))
  known: dict[tuple[str, int], CallRecord] = {}
  for _, _, rec in parsed:
    if isinstance(rec, CallRecord):
      known.setdefault((rec.rollout_id, rec.call_index), rec)
  pending = sorted((i for i, (_, _, rec) in enumerate(parsed) if isinstance(rec, UnresolvedCall)),
                   key=lambda i: (parsed[i][2].record.rollout_id, parsed[i][2].record.call_index))
  sidecar = _Sidecar(path)
  for i in pending:
    where, line, rec = parsed[i]
    rid, ref = rec.record.rollout_id, rec.input_ref
    earlier = None if ref is None else known.get((rid, ref.call_index))
    try:
      if ref is not None and earlier is None:
        raise CallLogError(where, "input_ref", f"call {ref.call_index} of rollout {rid!r} is not a valid record "
                           f"of this file")
      resolved = rec.resolve(earlier, sidecar, where)
    except CallLogError as e:
      parsed[i] = (where, line, e)
      continue
    parsed[i] = (where, line, resolved)
    known.setdefault((rid, resolved.call_index), resolved)
  return parsed  # type: ignore[return-value]  (every UnresolvedCall was replaced)


def iter_records(path: str | os.PathLike[str]) -> Iterator[Record]:
  """Yields the records of one file in order; raises CallLogError at the first bad line."""
  for _, _, rec in _file_records(os.fspath(path)):
    if isinstance(rec, CallLogError):
      raise rec
    yield rec


@dataclasses.dataclass
class LoadedLog:
  """Validated records grouped by rollout. `calls[rollout_id]` is sorted by call_index. `excluded`:
  the rollouts left out because a record of theirs could not be read (rollout id -> the first problem)."""
  calls: dict[str, list[CallRecord]]
  rollouts: dict[str, RolloutRecord]
  problems: list[str]
  excluded: dict[str, str] = dataclasses.field(default_factory=dict)

  def rollout_ids(self) -> list[str]:
    return sorted(set(self.calls) | set(self.rollouts))


def load(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
         errors: Literal["raise", "collect"] = "raise") -> LoadedLog:
  """Loads call and rollout records from one or more JSONL files (directories: every *.jsonl inside).

  With errors="collect", a bad line is recorded in `problems` (file, line, field) and its rollout is
  left out whole (`excluded`), as is a rollout whose records contradict each other; the rest of the log
  is still returned. A line too broken to name its rollout leaves out every rollout with calls in its
  file (a shim's log holds one rollout's calls): an incomplete rollout is never returned.
  """
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  files: list[str] = []
  for p in map(os.fspath, paths):
    if os.path.isdir(p):
      files.extend(os.path.join(p, n) for n in sorted(os.listdir(p)) if n.endswith(".jsonl"))
    else:
      files.append(p)
  calls: dict[str, list[CallRecord]] = {}
  rollouts: dict[str, RolloutRecord] = {}
  problems: list[str] = []
  excluded: dict[str, str] = {}

  def problem(err: CallLogError, rollout_ids: Iterable[str] = ()) -> None:
    if errors == "raise":
      raise err
    problems.append(str(err))
    for rid in rollout_ids:
      excluded.setdefault(rid, str(err))

  for path in files:
    records = _file_records(path)
    unnamed: list[CallLogError] = []
    for where, line, rec in records:
      if isinstance(rec, CallLogError):
        # A rollout with a broken record is incomplete: leave all of it out, not just the line.
        rid = _rollout_id_of(line)
        if rid is None:
          unnamed.append(rec)
        else:
          problem(rec, [rid])
        continue
      _add(rec, where, calls, rollouts, lambda err, rid: problem(err, [rid]))
    in_file = sorted({rec.rollout_id for _, _, rec in records if isinstance(rec, CallRecord)})
    for err in unnamed:
      problem(CallLogError(err.where, err.field, f"{err.message}; left out the rollouts with calls in this "
                           f"file: {in_file}"), in_file)
  for rid in excluded:
    calls.pop(rid, None)
    rollouts.pop(rid, None)
  for recs in calls.values():
    recs.sort(key=lambda r: r.call_index)
  return LoadedLog(calls=calls, rollouts=rollouts, problems=problems, excluded=excluded)


def _rollout_id_of(line: str) -> str | None:
  try:
    obj = json.loads(line)
  except ValueError:
    return None
  rid = obj.get("rollout_id") if isinstance(obj, dict) else None
  return rid if isinstance(rid, str) else None


def _add(rec: Record, where: str, calls: dict[str, list[CallRecord]],
         rollouts: dict[str, RolloutRecord], problem) -> None:
  rid = rec.rollout_id
  where = f"{where} (rollout {rid!r})"
  if isinstance(rec, RolloutRecord):
    if rid in rollouts:
      problem(CallLogError(where, "rollout_id", "more than one rollout record"), rid)
      return
    rollouts[rid] = rec
  else:
    same = calls.setdefault(rid, [])
    if any(c.call_index == rec.call_index for c in same):
      problem(CallLogError(where, "call_index", f"{rec.call_index} appears twice"), rid)
      return
    same.append(rec)
  for other in (rollouts.get(rid), calls.get(rid, [None])[0]):
    if other is not None and (other.task_id, other.harness) != (rec.task_id, rec.harness):
      problem(CallLogError(
          where, "task_id/harness",
          f"records disagree: {(other.task_id, other.harness)} vs {(rec.task_id, rec.harness)}"), rid)
      return


def ids_json(ids: Sequence[int], start: int = 0, where: str = "input_ids") -> bytes:
  """The JSON array text of `ids[start:]`, validated: ints in [0, MAX_TOKEN_ID] (errors name the field
  `where` and the element's index in `ids`)."""
  for i in range(start, len(ids)):
    t = ids[i]
    if not is_token_id(t):
      raise ValueError(f"{where}: element {i} is {t!r}, not an integer in [0, {MAX_TOKEN_ID}]")
  return b"[" + ",".join(map(str, ids[start:] if start else ids)).encode() + b"]"


_ARRAY_FIELDS = ("input_ids", "output_ids", "output_logprobs")


@dataclasses.dataclass(frozen=True)
class Line:
  """A record's validated JSONL line, in pieces for one `writev`, without its closing brace: the
  routes' field, which names their place in the sidecar, is known only once they are written there
  (`CallLogWriter.append`). `routes`: the routes the line stores (the call's own, past its prefix)."""
  pieces: list[bytes]
  routes: np.ndarray | None = None
  routes_start: int = 0

  def routes_field(self, offset: int) -> bytes:
    r = self.routes
    return b',"routed_experts":' + json.dumps(
        {"start": self.routes_start, "shape": list(r.shape), "dtype": r.dtype.name, "offset": offset,
         "crc32": zlib.crc32(r)}, separators=(",", ":")).encode()


def _routes_to_store(record: CallRecord, where: str) -> tuple[np.ndarray | None, int]:
  """The routes a call's line stores (its own, from `start`: the positions before are the referenced call's,
  which the loader checks) and their start."""
  r = record.routed_experts
  if r is None:
    return None, 0
  computed = max(len(record.input_ids) + len(record.output_ids) - 1, 0)
  if r.end != computed:
    raise CallLogError(where, "routed_experts", f"routes of positions [{r.start}, {r.end}), the call computed "
                       f"[0, {computed})")
  ids = compact(r.ids_PLK, f"{where}: routed_experts")
  return np.ascontiguousarray(ids.astype(ids.dtype.newbyteorder("<"), copy=False)), r.start


def record_line(record: Record, where: str, input_field: bytes | None = None) -> Line:
  """A record's validated JSONL line (`Line`).

  A call's token arrays come last, encoded apart from the small fields: the ~20K-id input of a Claude
  Code call is most of the line. `input_field` is the call's input already encoded and validated by the
  caller (`"input_ids":[...]`, or the reference form `"input_ref":{...},"input_tail":[...]`); the shim
  shares that encoding with its engine request, so the line is never copied whole. Log-probs go through
  orjson: `json` formats floats ~20x slower, which an 8K-token output would feel. A call's routes go to
  the sidecar: the line names their start; with start > 0 the caller's `input_field` must be the reference
  form to a call whose routes reach start (the loader checks).
  """
  if isinstance(record, RolloutRecord):
    obj = record.to_json()
    parse_record(obj, where)
    return Line([json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()[:-1]])
  obj = _shallow_json(CALL_SCHEMA, record)
  obj["input_ids"] = [] if input_field is not None else list(record.input_ids)
  obj["output_ids"], obj["output_logprobs"] = list(record.output_ids), list(record.output_logprobs)
  parse_record(obj, where)
  routes, routes_start = _routes_to_store(record, where)
  if routes_start and input_field is None:
    raise CallLogError(where, "routed_experts", f"start {routes_start} needs the input's reference form")
  small = {k: v for k, v in obj.items() if k not in _ARRAY_FIELDS}
  head = json.dumps(small, separators=(",", ":"), allow_nan=False).encode()
  join = lambda ids: ",".join(map(str, ids)).encode()  # (validated by parse_record above)
  if input_field is None:
    input_field = b'"input_ids":[' + join(obj["input_ids"]) + b"]"
  output = join(obj["output_ids"])
  return Line([head[:-1] + b",", input_field,
               b',"output_ids":[' + output + b'],"output_logprobs":' + orjson.dumps(obj["output_logprobs"])],
              routes, routes_start)


class _AppendOnly:
  """One file appended to in whole pieces: a write that fails part-way is cut back off (see CallLogWriter)."""

  def __init__(self, path: str):
    self.path = path
    # O_APPEND: each write lands whole at the end even if another process appends to the same file.
    self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    self._torn_at: int | None = None  # Where a failed write could not be cut back to (yet).

  def append(self, pieces: Sequence[bytes], fsync: bool) -> int:
    """Writes `pieces` whole at the end, then fsyncs (with `fsync`); returns the offset they start at. On an
    OSError (ENOSPC, EIO) the file is truncated back to that offset, then the error is raised."""
    if self._torn_at is not None:
      os.ftruncate(self.fd, self._torn_at)
      self._torn_at = None
    start = os.lseek(self.fd, 0, os.SEEK_END)
    try:
      written = os.writev(self.fd, pieces)
      if written < sum(map(len, pieces)):  # A short write (disk nearly full): finish the line or fail.
        rest = memoryview(b"".join(pieces))[written:]
        while rest:
          rest = rest[os.write(self.fd, rest):]
      if fsync:
        os.fsync(self.fd)
    except OSError:
      # What is not on disk whole is not on disk at all (nor what failed its fsync: it was not
      # acknowledged). Truncating frees space, so it works on a full disk; should it fail, the next
      # append retries it before writing.
      self._torn_at = start
      os.ftruncate(self.fd, start)
      self._torn_at = None
      raise
    return start

  def close(self) -> None:
    os.close(self.fd)


class CallLogWriter:
  """Appends records to one JSONL file, each written whole and (with `fsync`, the default) fsynced
  before `write` returns; a call's routes go to the sidecar `<path>.routes` first, fsynced too.

  Thread-safe. Records are validated first, so a writer never produces a line the loader rejects. A
  write that fails part-way (a full disk) is cut back off, so the file holds only whole lines and the
  next record starts on a clean one; this assumes the writer is the file's (and sidecar's) only appender.
  """

  def __init__(self, path: str | os.PathLike[str], fsync: bool = True):
    self.path = os.fspath(path)
    self.fsync = fsync
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    self._log: _AppendOnly | None = _AppendOnly(self.path)
    self._routes: _AppendOnly | None = None  # opened with the first routes
    self._lock = threading.Lock()

  def write(self, record: Record) -> None:
    self.append(record_line(record, f"{self.path}:<new {type(record).__name__}>"))

  def append(self, line: Line) -> None:
    """Appends one already validated line: its routes to the sidecar, then the line naming them, each
    fsynced. On an OSError (ENOSPC, EIO) what was written of the line is truncated off, then the error is
    raised (routes already in the sidecar stay there, unread)."""
    with self._lock:
      if self._log is None:
        raise ValueError(f"{self.path}: call log writer is closed")
      pieces = line.pieces
      if line.routes is not None:
        if self._routes is None:
          self._routes = _AppendOnly(self.path + ROUTES_SUFFIX)
        offset = self._routes.append([line.routes.data], self.fsync)
        pieces = [*pieces, line.routes_field(offset)]
      self._log.append([*pieces, b"}\n"], self.fsync)

  def close(self) -> None:
    with self._lock:
      for f in (self._log, self._routes):
        if f is not None:
          f.close()
      self._log = self._routes = None

  def __enter__(self) -> "CallLogWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
