"""A GRPO group's deadline (`rollout.group_deadline_s`): the rollouts a training step stops waiting for.

One `GroupClock` a launch of a group. Its clock starts with the group's first rollout. Each rollout runs
in a thread of its own while its caller (a pool thread of the step) waits for it, up to the deadline:
past it, every rollout of the group not recorded yet is given up. Its record is replaced by an overdue
one (status "timeout", `extra.overdue`, the reason; the same rollout id, so its calls in the shim's log
still name it), its own record is dropped should it ever come, and its caller returns at once; a
rollout of the group that had not started by then never starts. So a step waits for no group longer than
its deadline, whatever hangs (a harness, a checker, the shim), and the pool's slots are free again. A
given-up rollout keeps its thread (a daemon: it does not hold the process at exit) until it ends by its
own timeouts. A group with an overdue rollout is not trained (clawjax.train.step_data drops it whole,
counted as `overdue`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from clawjax.calllog import CallLogWriter, Record, RolloutRecord
from clawjax.harness.rollout import RolloutOutcome


# A clawjax.run.session.RolloutJob (its task, harness and group; that module uses this one).
RolloutJob = Any


class Timer(Protocol):
  """What `threading.Timer(interval, function)` returns (a simulated clock may stand for it)."""
  daemon: bool

  def start(self) -> None: ...

  def cancel(self) -> None: ...


@dataclasses.dataclass
class _Ticket:
  """One rollout of the group: "running", then "given_up", or "recorded" (its own record went out) and
  "ended" (it returned)."""
  state: str = "running"
  done: threading.Event = dataclasses.field(default_factory=threading.Event)
  outcome: Any = None
  error: BaseException | None = None


class _Gated:
  """The writer a rollout's own record goes through: dropped once the rollout is given up."""

  def __init__(self, clock: "GroupClock", ticket: _Ticket, writer: CallLogWriter):
    self.clock, self.ticket, self.writer = clock, ticket, writer

  def write(self, record: Record) -> None:
    with self.clock.lock:
      if self.ticket.state == "given_up":
        return
      self.ticket.state = "recorded"
    self.writer.write(record)


class GroupClock:

  def __init__(self, deadline_s: float, size: int, timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer):
    """`size`: the group's rollouts (the clock stops once each is recorded or given up)."""
    self.deadline_s, self.size, self._timer_factory = deadline_s, size, timer
    self.lock = threading.Lock()
    self.overdue = False  # the deadline passed with a rollout of the group unrecorded
    self._tickets: list[tuple[_Ticket, Callable[[], RolloutOutcome]]] = []  # with how each is given up
    self._ended = 0
    self._timer: Timer | None = None

  def run(self, job: RolloutJob, rid: str, writer: CallLogWriter, rollout: Callable[[_Gated], RolloutOutcome],
          extra: Mapping[str, Any]) -> RolloutOutcome:
    """`rollout(gated_writer)` (rollout `rid` of `job`) in a thread of its own, waiting for it until the
    group's deadline; then the overdue outcome (its record, with `extra`, written to `writer`)."""
    ticket = _Ticket()
    give_up = lambda: self._overdue_record(job, rid, writer, extra)
    with self.lock:
      if self.overdue:  # the group's deadline passed before this rollout started
        ticket.state = "given_up"
      else:
        self._tickets.append((ticket, give_up))
        if self._timer is None:
          self._timer = self._timer_factory(self.deadline_s, self._expire)
          self._timer.daemon = True
          self._timer.start()
    if ticket.state == "given_up":
      self._end()
      return give_up()

    def target() -> None:
      outcome, error = None, None
      try:
        outcome = rollout(_Gated(self, ticket, writer))
      except BaseException as e:  # pylint: disable=broad-except  (handed to the waiting caller)
        error = e
      with self.lock:
        if ticket.state == "given_up":  # the deadline's outcome stands
          return
        ticket.state, ticket.outcome, ticket.error = "ended", outcome, error
      ticket.done.set()

    threading.Thread(target=target, name=f"{threading.current_thread().name}-rollout", daemon=True).start()
    ticket.done.wait()
    self._end()
    if ticket.error is not None:
      raise ticket.error
    return ticket.outcome

  def _end(self) -> None:
    with self.lock:
      self._ended += 1
      if self._ended == self.size and self._timer is not None:
        self._timer.cancel()

  def _expire(self) -> None:
    with self.lock:
      late = [(t, give_up) for t, give_up in self._tickets if t.state == "running"]
      self.overdue = self.overdue or bool(late) or len(self._tickets) < self.size
      for t, _ in late:
        t.state = "given_up"
    for t, give_up in late:
      t.outcome = give_up()
      t.done.set()

  def _overdue_record(self, job: RolloutJob, rid: str, writer: CallLogWriter, extra: Mapping[str, Any]) -> RolloutOutcome:
    reason = (f"overdue: group {job.group} passed its deadline of {self.deadline_s:g} s (rollout.group_deadline_s) "
              "before this rollout ended; given up, and the group is not trained")
    record = RolloutRecord(rid, job.task.task_id, job.harness, None, "timeout",
                           {**extra, "group": job.group, "overdue": True, "reason": reason})
    writer.write(record)
    return RolloutOutcome(record, None, [])
