"""Live rollouts: per-rollout secret key, URL prefix, call-log writer and token-in-token-out prompt state.

Each rollout owns its own log file `<log_dir>/<rollout_id>.jsonl` and writer; a request is routed to a
rollout only through its id in the URL path plus its key (or its key alone), so one rollout can never
write into another's log. A finished rollout is forgotten by the routing tables: its key gets 401.
Generated ids and keys carry 128 random bits; an id given by the caller must match `ROLLOUT_ID` whole
(it names a file).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hmac
import os
import re
import secrets
from typing import Any

from clawjax.calllog import CallRecord, load
from clawjax.serving.chat import MessageMemo
from clawjax.serving.logwriter import RolloutLogWriter
from clawjax.serving.profiles import HarnessProfile

ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclasses.dataclass
class Rollout:
  rollout_id: str
  task_id: str
  harness: str
  api_key: str
  profile: HarnessProfile
  writer: RolloutLogWriter
  builder: Any  # clawjax.text.prompt.PromptBuilder: this rollout's incremental prompt state.
  next_call_index: int = 0
  inflight: int = 0
  finished: bool = False
  log_closed: bool = False
  failure: str | None = None  # Why a call of it could not be recorded: the rollout is not trainable.
  calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
  memos: dict[str, MessageMemo] = dataclasses.field(  # Per API dialect.
      default_factory=lambda: collections.defaultdict(MessageMemo))
  idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

  def __post_init__(self):
    self.idle.set()

  def begin_call(self) -> int:
    index, self.next_call_index = self.next_call_index, self.next_call_index + 1
    self.inflight += 1
    self.idle.clear()
    return index

  def end_call(self) -> None:
    self.inflight -= 1
    if not self.inflight:
      self.idle.set()
      if self.finished:  # The last call of a rollout finished while it was in flight.
        self.close_log()

  def close_log(self) -> None:
    """Closes the log and drops the prompt state; the summary stays for GET /rollouts/{id}."""
    if not self.log_closed:
      self.log_closed = True
      self.writer.close()
      self.builder = None
      self.memos.clear()

  def fail(self, reason: str) -> None:
    """Marks the rollout failed (the first reason stays)."""
    self.failure = self.failure or reason

  def note_written(self, record: CallRecord) -> None:
    """Adds a call whose record is on disk to the summary."""
    self.calls.append(_call_summary(record))

  def summary(self) -> dict[str, Any]:
    return {"rollout_id": self.rollout_id, "task_id": self.task_id, "harness": self.harness,
            "finished": self.finished, "inflight": self.inflight, "log_path": self.writer.path,
            "failed": self.failure, "calls": sorted(self.calls, key=lambda c: c["call_index"])}


def _call_summary(record: CallRecord) -> dict[str, Any]:
  return {"call_index": record.call_index, "status": record.status, "role": record.role,
          "input_tokens": len(record.input_ids), "output_tokens": len(record.output_ids),
          "finish_reason": record.finish_reason, "t_end": record.t_end}


def summary_from_log(rollout_id: str, task_id: str, harness: str, log_path: str,
                     failed: str | None) -> dict[str, Any]:
  """A finished rollout's summary (as `Rollout.summary`) read back from its call log, for a rollout whose
  shim process is gone. A log the loader cannot read whole (the record being written at a kill -9)
  lists no calls, and says why in `failed`, as training would leave the rollout out."""
  calls: list[dict[str, Any]] = []
  try:
    loaded = load(log_path, errors="collect")
  except OSError as e:
    problem = f"its call log cannot be read: {e}"
  else:
    problem = loaded.excluded.get(rollout_id)
    calls = [_call_summary(r) for r in loaded.calls.get(rollout_id, [])]
  if problem:
    failed = f"{failed}; {problem}" if failed else problem
  return {"rollout_id": rollout_id, "task_id": task_id, "harness": harness, "finished": True,
          "inflight": 0, "log_path": log_path, "failed": failed, "calls": calls}


class RolloutRegistry:
  def __init__(self, log_dir: str, fsync: bool = True):
    self.log_dir, self.fsync = log_dir, fsync
    self._by_id: dict[str, Rollout] = {}
    self._by_key: dict[str, Rollout] = {}
    self._finished: dict[str, Rollout] = {}
    # Rollouts of a shim worker process that died, which this process took the place of: id -> what
    # happened. Their calls get 401 saying so, not "unknown".
    self.lost: dict[str, str] = {}

  def create(self, task_id: str, harness: str, profile: HarnessProfile, builder: Any,
             rollout_id: str | None = None) -> Rollout:
    rollout_id = rollout_id or f"r-{secrets.token_hex(16)}"
    if not ROLLOUT_ID.fullmatch(rollout_id):
      raise ValueError(f"rollout_id {rollout_id!r} must match {ROLLOUT_ID.pattern}")
    if rollout_id in self._by_id or rollout_id in self._finished:
      raise ValueError(f"rollout_id {rollout_id!r} already exists")
    path = os.path.join(self.log_dir, f"{rollout_id}.jsonl")
    if os.path.exists(path):
      raise ValueError(f"rollout_id {rollout_id!r}: log {path} already exists")
    rollout = Rollout(rollout_id, task_id, harness, f"sk-clawjax-{secrets.token_hex(16)}", profile,
                      RolloutLogWriter(path, fsync=self.fsync), builder)
    self._by_id[rollout_id] = self._by_key[rollout.api_key] = rollout
    return rollout

  def lookup(self, key: str | None, rollout_id: str | None) -> Rollout | None:
    """The live rollout `key` belongs to; with `rollout_id` (from the URL prefix) both must agree."""
    if not key:
      return None
    if rollout_id is None:
      return self._by_key.get(key)
    rollout = self._by_id.get(rollout_id)
    if rollout is None or not hmac.compare_digest(rollout.api_key.encode(), key.encode()):
      return None
    return rollout

  def get(self, rollout_id: str) -> Rollout | None:
    return self._by_id.get(rollout_id) or self._finished.get(rollout_id)

  async def finish(self, rollout_id: str, timeout_s: float) -> Rollout | None:
    """Stops routing to the rollout, waits (bounded) for its calls in flight, closes its log."""
    rollout = self._by_id.pop(rollout_id, None)
    if rollout is None:
      return self._finished.get(rollout_id)
    self._by_key.pop(rollout.api_key, None)
    rollout.finished = True
    self._finished[rollout_id] = rollout
    try:
      await asyncio.wait_for(rollout.idle.wait(), timeout_s)
    except asyncio.TimeoutError:
      return rollout  # A call still in flight keeps the log open; its end_call closes it.
    rollout.close_log()
    return rollout

  def live(self) -> list[Rollout]:
    return list(self._by_id.values())

  async def close(self, timeout_s: float) -> None:
    """Finishes every rollout, giving calls in flight up to `timeout_s` in all to be logged."""
    for rid in list(self._by_id):
      await self.finish(rid, timeout_s=0)
    busy = [r.idle.wait() for r in self._finished.values() if not r.log_closed]
    if busy:
      await asyncio.wait([asyncio.ensure_future(b) for b in busy], timeout=timeout_s)
    for rollout in self._finished.values():
      rollout.close_log()
