"""The lock a weight update takes against generation, as SGLang 0.5.23 holds its `model_update_lock`
(tokenizer_manager.py, an `RWLock` of utils/aio_rwlock.py): every request holds it shared for its whole
answer, an update holds it alone; while an update waits for it no new request gets it, so new requests
are held and the ones in flight finish first.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class UpdateLock:
  """A writer-preferring shared/exclusive lock for one event loop. `in_flight`: requests holding it now;
  `held`: requests that waited for the current (or last) update."""

  def __init__(self):
    self._changed = asyncio.Condition()
    self.in_flight = 0
    self.held = 0
    self._updating = False
    self._updates_waiting = 0

  @property
  def blocked(self) -> bool:
    """Whether an update waits or runs: a new request waits."""
    return self._updating or self._updates_waiting > 0

  @contextlib.asynccontextmanager
  async def request(self) -> AsyncIterator[None]:
    """Held for one request's answer."""
    async with self._changed:
      if self.blocked:
        self.held += 1
        await self._changed.wait_for(lambda: not self.blocked)
      self.in_flight += 1
    try:
      yield
    finally:
      async with self._changed:
        self.in_flight -= 1
        self._changed.notify_all()

  @contextlib.asynccontextmanager
  async def update(self) -> AsyncIterator[None]:
    """Held alone: entered once every request in flight has ended; holds new requests from the call on."""
    async with self._changed:
      self._updates_waiting += 1
      if self._updates_waiting == 1 and not self._updating:
        self.held = 0
      try:
        await self._changed.wait_for(lambda: not self._updating and self.in_flight == 0)
      finally:
        self._updates_waiting -= 1
        self._changed.notify_all()  # (requests held for an update that gave up)
      self._updating = True
    try:
      yield
    finally:
      async with self._changed:
        self._updating = False
        self._changed.notify_all()
