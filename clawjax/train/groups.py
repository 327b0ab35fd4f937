"""GRPO groups as the unit of rollout work: which groups a step samples, and a runner that keeps groups
in flight in the background while the learner works (asynchronous RL).

A group is one draw of a (task, harness) pair in a step's task sample, run `rollouts_per_task` times; its
rollouts, and only they, are normalised together (clawjax.rl.advantages), so the same pair drawn by two
steps makes two groups even when one learner step trains both. Groups are numbered in the run's data
order: step s (from 1) holds the indices [(s - 1) * G, s * G), G groups a step, so that an index alone
names its group again after a resume. Step s's sample is a function of (seed, s) only.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from clawjax.calllog import CallLogWriter
from clawjax.run.deadline import GroupClock, Timer
from clawjax.run.session import PolicySession, RolloutJob, clocked_rollout
from clawjax.tasks import Task


THREAD_PREFIX = "clawjax-group"  # the names of a GroupRunner's rollout threads


@dataclasses.dataclass(frozen=True)
class Group:
  index: int   # position in the run's data order
  step: int    # the step whose task sample it belongs to
  task: Task
  harness: str

  @property
  def key(self) -> str:
    return f"g{self.index}"

  def jobs(self, rollouts: int) -> list[RolloutJob]:
    return [RolloutJob(self.task, self.harness, k, group=self.index) for k in range(rollouts)]


def groups_per_step(tasks_per_step: int, n_tasks: int, n_harnesses: int) -> int:
  return min(tasks_per_step, n_tasks) * n_harnesses


def step_groups(seed: int, tasks_per_step: int, harnesses: Sequence[str], tasks: Sequence[Task],
                step: int) -> list[Group]:
  """Step `step`'s groups in data order: its task sample (a function of (seed, step)), each task under
  every harness."""
  rng = np.random.default_rng([seed, step])
  order = rng.permutation(len(tasks))[:min(tasks_per_step, len(tasks))]
  first = (step - 1) * groups_per_step(tasks_per_step, len(tasks), len(harnesses))
  pairs = [(tasks[i], h) for i in order for h in harnesses]
  return [Group(first + j, step, task, harness) for j, (task, harness) in enumerate(pairs)]


@dataclasses.dataclass
class CompletedGroup:
  group: Group
  path: pathlib.Path   # its rollout records (the shim's call logs are in the session's log dir)
  wall_s: float        # from its launch to its last rollout's end
  launch_version: int  # the policy version when it was launched: no call of it was sampled by an older one
  overdue: bool = False  # past its deadline with rollouts given up (clawjax.run.deadline): not trained


class GroupRunner:
  """Runs groups' rollouts through a session, `concurrency` at a time, in launch order; `take` returns n
  completed groups, the earliest launched (then the oldest in data order) first. A straggling group
  holds no one up until it must be taken so that it, and every group launched before it, is trained in
  time: later groups complete past it and are taken instead, while it can still be trained later. No
  group is waited for past `deadline_s` from its first rollout's start: it then completes `overdue`, its
  rollouts still running given up (clawjax.run.deadline), so `take` returns by then whatever hangs."""

  def __init__(self, session: PolicySession, rollouts_per_task: int, concurrency: int, out_dir: pathlib.Path,
               deadline_s: float, timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer):
    self.session, self.rollouts, self.out_dir = session, rollouts_per_task, out_dir
    self.deadline_s, self._timer = deadline_s, timer
    self._pool = concurrent.futures.ThreadPoolExecutor(max(1, concurrency), thread_name_prefix=THREAD_PREFIX)
    self._cv = threading.Condition()
    self._done: list[CompletedGroup] = []
    self._running: dict[int, tuple[Group, int]] = {}  # index -> (group, the version it was launched at)

  def launch(self, group: Group, version: int) -> None:
    """Starts the group's rollouts; `version` is the policy version now (what `take`'s `due` compares)."""
    self.out_dir.mkdir(parents=True, exist_ok=True)
    path = self.out_dir / f"{group.key}.jsonl"
    if path.exists():  # the same group run before a crash: its rollouts are run afresh
      path.rename(path.with_name(f"{path.name}.partial-{time.time_ns()}"))
    writer = CallLogWriter(path)
    remaining = [self.rollouts]
    started = time.time()
    clock = GroupClock(self.deadline_s, self.rollouts, self._timer)
    label = f"s{group.step}"

    def one(job: RolloutJob) -> None:
      try:
        clocked_rollout(self.session, clock, job, writer, label)
      finally:
        with self._cv:
          remaining[0] -= 1
          if remaining[0] == 0:
            writer.close()
            del self._running[group.index]
            self._done.append(CompletedGroup(group, path, time.time() - started, version, clock.overdue))
            self._cv.notify_all()

    with self._cv:
      self._running[group.index] = group, version
    for job in group.jobs(self.rollouts):
      self._pool.submit(one, job)

  def take(self, n: int, due: int, later: Sequence[int]) -> list[CompletedGroup]:
    """n completed groups, in data order. A group launched at version `due` + k must be taken within k
    steps (k = 0: now), and the next steps take `later[0]`, `later[1]`, ... groups: so whenever more
    groups launched at `due` + k or before are left than the next k steps take, the excess is taken now
    (of those launched earliest). Blocks until n groups have completed, among them that excess for every
    k; takes the earliest launched completed groups, the oldest in data order first among equals."""
    with self._cv:
      if n > len(self._done) + len(self._running):
        raise ValueError(f"take({n}): only {len(self._done) + len(self._running)} groups launched")
      launched = [c.launch_version for c in self._done] + [v for _, v in self._running.values()]
      # (More than n only where the groups in flight outnumber what the steps ahead take, as after a
      # resume that lowered max_staleness: those left over are dropped as stale.)
      must = [(due + k, min(n, sum(v <= due + k for v in launched) - sum(later[:k]))) for k in range(len(later) + 1)]
      self._cv.wait_for(lambda: len(self._done) >= n and all(
          sum(c.launch_version <= bound for c in self._done) >= m for bound, m in must))
      ready = sorted(self._done, key=lambda c: (c.launch_version, c.group.index))
      taken = sorted(ready[:n], key=lambda c: c.group.index)
      self._done = ready[n:]
    return taken

  @property
  def in_flight(self) -> list[Group]:
    with self._cv:
      return sorted((g for g, _ in self._running.values()), key=lambda g: g.index)

  @property
  def waiting(self) -> list[Group]:
    """Completed groups not taken yet."""
    with self._cv:
      return [c.group for c in self._done]

  def close(self) -> None:
    """Drops the rollouts not started; waits for the running ones (they end by their own timeouts, or
    are given up at their group's deadline)."""
    self._pool.shutdown(wait=True, cancel_futures=True)
