"""The real asynchronous loop (clawjax.train.async_loop.run_async, its GroupRunner, build_step), or the
synchronous one (clawjax.train.sync_loop.run_sync), on a simulated clock: stand-ins for what takes time (a policy session whose rollouts take a task-dependent
number of clock units and whose calls carry the policy version they started at, and a learner step that
takes `learner_time` units), so that runs of hundreds of steps take seconds and come out the same on a
loaded machine as on an idle one.

The clock moves to the next wake-up only when every other thread is blocked: the rollout threads asleep on
the clock or idle in their pool, and the loop waiting for groups or asleep in its learner step.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import heapq
import itertools
import json
import pathlib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from clawjax.calllog import CallLogWriter, RolloutRecord
from clawjax.run.session import RolloutJob
from clawjax.tasks.records import Task
from clawjax.train.async_loop import run_async
from clawjax.train.config import TrainConfig
from clawjax.train.groups import THREAD_PREFIX as GROUP_THREADS, Group, step_groups
from clawjax.train.layout import RunLayout
from clawjax.train.step_data import BatchConfig, StepData
from clawjax.train.sync_loop import run_sync
from clawjax.tree import synthetic

# Frames in which a thread is blocked: a condition's wait (the clock, the runner's take), a pool worker
# waiting for work, or a join (the runner's close, waiting for the last rollouts).
_BLOCKED = {("threading.py", "wait"), ("thread.py", "_worker"), ("threading.py", "_wait_for_tstate_lock")}


class SimClock:

  def __init__(self):
    self.now = 0.0
    self._owner = threading.get_ident()  # the thread that runs the loop under test
    self._cv = threading.Condition()
    self._wakes: list[tuple[float, int]] = []
    self._seq = itertools.count()
    self._events = 0  # bumped by every sleep and wake-up, to see that nothing moved between two looks
    self._stop = threading.Event()
    self._failure: BaseException | None = None  # what ended the ticker: every sleeper raises it
    self._ticker = threading.Thread(target=self._tick, name="sim-clock", daemon=True)
    self._ticker.start()

  def sleep(self, units: float) -> None:
    with self._cv:
      wake = (self.now + units, next(self._seq))
      heapq.heappush(self._wakes, wake)
      self._events += 1
      self._cv.wait_for(lambda: self.now >= wake[0] or self._failure is not None)
      if self._failure is not None:
        raise RuntimeError("the simulated clock's ticker failed: the run cannot go on") from self._failure
      self._events += 1

  def timer(self, units: float, fn: Callable[[], None]) -> "SimTimer":
    """A threading.Timer on this clock (what times the groups' deadlines)."""
    return SimTimer(self, units, fn)

  def close(self) -> None:
    self._stop.set()
    self._ticker.join()

  def _simulated(self) -> set[int]:
    """The threads the clock waits for: the loop's and the group runner's rollout threads. Threads that
    earlier tests of the same process left running (servers, checkpoint writers) are not the
    simulation's and never block it."""
    return {self._owner} | {t.ident for t in threading.enumerate() if t.name.startswith(GROUP_THREADS)}

  def _others_blocked(self) -> bool:
    """Every simulated thread waits. A thread being started has no frame yet (nor an ident) while its
    starter waits in `Thread.start`: it counts as running, else the clock moves before it runs."""
    frames = sys._current_frames()  # pylint: disable=protected-access
    return all(ident in frames and (pathlib.Path(frames[ident].f_code.co_filename).name,
                                    frames[ident].f_code.co_name) in _BLOCKED for ident in self._simulated())

  def _tick(self) -> None:
    """Moves the clock; if it fails, the sleepers raise its error (a dead ticker would hang the test)."""
    try:
      self._advance()
    except BaseException as e:
      with self._cv:
        self._failure = e
        self._cv.notify_all()
      raise

  def _advance(self) -> None:
    while not self._stop.wait(0.0002):
      with self._cv:
        seen = self._events
        if not self._wakes:
          continue
      # Quiet twice, a moment apart: a thread just woken still shows its wait frame for a moment.
      if not self._others_blocked():
        continue
      time.sleep(0.001)
      with self._cv:
        if self._events != seen or not self._others_blocked():
          continue
        self.now = heapq.heappop(self._wakes)[0]
        while self._wakes and self._wakes[0][0] <= self.now:
          heapq.heappop(self._wakes)
        self._cv.notify_all()


class SimTimer:
  """threading.Timer's interface: `fn` runs `units` clock units after `start`, unless cancelled first. Its
  thread is one of the simulation's (it sleeps on the clock)."""

  def __init__(self, clock: SimClock, units: float, fn: Callable[[], None]):
    self.clock, self.units, self.fn = clock, units, fn
    self.daemon = True
    self._cancelled = threading.Event()

  def start(self) -> None:
    threading.Thread(target=self._run, name=f"{GROUP_THREADS}-timer", daemon=True).start()

  def cancel(self) -> None:
    self._cancelled.set()

  def _run(self) -> None:
    self.clock.sleep(self.units)
    if not self._cancelled.is_set():
      self.fn()


# What a rollout of the simulated session does, from (its job, its label, how often it ran before).
Behaviour = Callable[[RolloutJob, str, int], bool]
# The policy version its call records, from (its job, its label, how often it ran before, the version
# at its start).
CallVersion = Callable[[RolloutJob, str, int, int], "int | None"]
VOCAB = 64  # the ids of the simulated calls lie in [0, VOCAB)


def as_sampled(job: RolloutJob, label: str, runs: int, version: int) -> int:
  del job, label, runs
  return version


class SimSession:
  """A policy session: a rollout sleeps `duration(job, label)` clock units; its one call records
  `call_version` of the policy version at its start (that version itself by default); its reward is
  `reward(job)`; where `fails`, it fails instead (no calls, no reward). Every rollout's group is counted
  in `runs_of` (how often its rollouts started)."""

  def __init__(self, clock: SimClock, calls_dir: pathlib.Path, duration: Callable[[RolloutJob, str], float],
               reward: Callable[[RolloutJob], float], call_version: CallVersion, fails: Behaviour):
    self.clock, self.calls_dir, self.duration, self.reward = clock, calls_dir, duration, reward
    self.call_version, self.fails = call_version, fails
    self.runs_of: collections.Counter[int] = collections.Counter()
    self.version = 0
    self.process_index = 0
    self._ids = itertools.count()
    self._runs: collections.Counter[tuple[str, str, int]] = collections.Counter()
    self._lock = threading.Lock()

  def record_extra(self, job: RolloutJob) -> dict[str, Any]:
    return {"group": job.group}

  def rollout(self, job: RolloutJob, writer: CallLogWriter, label: str, rid: str | None = None) -> None:
    version = self.version
    with self._lock:
      name = f"{label}-{job.task.task_id}-{job.index}-{next(self._ids)}"
      rng = np.random.default_rng(len(name))
      rid = rid or name
      runs = self._runs[label, job.task.task_id, job.index]
      self._runs[label, job.task.task_id, job.index] += 1
      self.runs_of[job.group] += 1
    self.clock.sleep(self.duration(job, label))
    extra = {} if getattr(job, "group", None) is None else {"group": job.group}
    if self.fails(job, label, runs):
      writer.write(RolloutRecord(rid, job.task.task_id, job.harness, None, "failed", extra))
      return
    recorded = self.call_version(job, label, runs, version)
    calls = synthetic.agent_rollout(rng, rollout_id=rid, task_id=job.task.task_id, harness=job.harness,
                                    prompt_len=8, n_calls=1, tokens_per_call=4, vocab_size=VOCAB)
    self.calls_dir.mkdir(parents=True, exist_ok=True)
    with CallLogWriter(self.calls_dir / f"{rid}.jsonl") as calls_log:
      for call in calls:
        calls_log.write(dataclasses.replace(call, policy_version=recorded))
    writer.write(RolloutRecord(rid, job.task.task_id, job.harness, self.reward(job), "ok", extra))

  def run(self, jobs: list[RolloutJob], writer: CallLogWriter, *, label: str, desc: str = "",
          group_deadline_s: float | None = None) -> None:
    """The synchronous loop's batch of rollouts, all at once, each on a thread the clock waits for (no
    group deadline here: tests/run/test_deadline.py holds the real session's)."""
    del desc, group_deadline_s
    with concurrent.futures.ThreadPoolExecutor(max(1, len(jobs)), thread_name_prefix=GROUP_THREADS) as pool:
      for future in [pool.submit(self.rollout, job, writer, label) for job in jobs]:
        future.result()


@dataclasses.dataclass
class Trained:
  step: int
  version: int        # the policy version it trained on
  dropped: int        # groups taken and dropped as stale
  data: StepData
  extra: dict[str, float]


class SimSteps:
  """The learner side of a step (clawjax.train.steps.StepTrainer) of a model of `vocab_size` tokens:
  records what the loop hands it, takes `learner_time` clock units, then pushes the next version."""

  def __init__(self, session: SimSession, clock: SimClock, learner_time: float, vocab_size: int):
    self.session, self.clock, self.learner_time, self.vocab_size = session, clock, learner_time, vocab_size
    self.cursor: dict[str, Any] = {"step": 0}
    self.trained: list[Trained] = []

  def train(self, step: int, data: StepData, extra: dict[str, float], data_path) -> None:
    self.trained.append(Trained(step, self.session.version, int(extra.get("groups/dropped_stale", 0)), data, extra))
    self.clock.sleep(self.learner_time)
    self.session.version = step
    self.cursor["step"] = step


class SimTrainer:
  """The run (clawjax.train.async_loop.GroupedRun): the real data order over `tasks`, one harness."""

  def __init__(self, cfg: TrainConfig, workdir: pathlib.Path, tasks: list[Task], process_index: int = 0,
               process_count: int = 1):
    self.cfg, self.workdir, self.tasks = cfg, workdir, tasks
    self.layout = RunLayout(workdir, process_index, process_count)

  def step_groups(self, step: int, draw: int = 0) -> list[Group]:
    return step_groups(self.cfg.seed, self.cfg.tasks_per_step, self.cfg.harnesses, self.tasks, step, draw,
                       self.cfg.batch.max_draw_factor)

  def group(self, index: int) -> Group:
    per_step = len(self.step_groups(1))
    return self.step_groups(index // per_step + 1)[index % per_step]

  def owns(self, group: Group) -> bool:
    return self.layout.owns(group)

  def own_groups(self, step: int, draw: int = 0) -> list[Group]:
    return [g for g in self.step_groups(step, draw) if self.owns(g)]


def task(task_id: str) -> Task:
  return Task(task_id=task_id, prompt=f"do {task_id}", category="sim", grading_type="automated",
              mount_dir="/tmp", input_files=(), checker=None, rubric=None, source="sim")


def config(steps: int, tasks_per_step: int, rollouts: int, max_staleness: int, async_rl: bool = True,
           batch: dict[str, Any] | None = None, **kw) -> TrainConfig:
  """A run of `steps` steps (its tasks come from `task`; `tasks` only has to exist); `batch`: more fields
  of its BatchConfig."""
  return TrainConfig(tasks=str(pathlib.Path(__file__).parent), steps=steps, tasks_per_step=tasks_per_step,
                     rollouts_per_task=rollouts, harnesses=("mini",), concurrency=1024, async_rl=async_rl,
                     batch=BatchConfig(row_len=256, rows=64, max_staleness=max_staleness, **(batch or {})), **kw)


@dataclasses.dataclass
class SimRun:
  trainer: SimTrainer
  session: SimSession
  steps: SimSteps
  groups_by_step: dict[int, list[int]]  # groups trained by each step (from its groups.json)
  dropped_by_step: dict[int, list[int]]  # groups dropped as stale by each step (from its groups.json)
  overdue_by_step: dict[int, list[int]]  # groups dropped as overdue by each step (from its groups.json)


def never(job: RolloutJob, label: str, runs: int) -> bool:
  del job, label, runs
  return False


def alternating(job: RolloutJob) -> float:
  return float(job.index % 2)


def run(workdir: pathlib.Path, cfg: TrainConfig, tasks: list[Task], duration: Callable[[RolloutJob, str], float],
        learner_time: float, *, call_version: CallVersion = as_sampled, fails: Behaviour = never,
        vocab_size: int = VOCAB, process_index: int = 0, process_count: int = 1,
        reward: Callable[[RolloutJob], float] = alternating) -> SimRun:
  """`run_async` (or `run_sync`, without cfg.async_rl) over `cfg.steps` steps on a simulated clock; rollout
  k of a group scores `reward(job)`, k % 2 by default."""
  clock = SimClock()
  trainer = SimTrainer(cfg, workdir, tasks, process_index, process_count)
  session = SimSession(clock, trainer.layout.calls_dir, duration, reward, call_version, fails)
  steps = SimSteps(session, clock, learner_time, vocab_size)
  try:
    if cfg.async_rl:
      run_async(trainer, steps, start=0, timer=clock.timer)
    else:
      run_sync(trainer, steps, start=0)
  finally:
    clock.close()
  groups_file = lambda step: workdir / "steps" / f"step_{step}" / trainer.layout.per_process("groups.json")
  records = {t.step: json.loads(groups_file(t.step).read_text()) for t in steps.trained if cfg.async_rl}
  indices = lambda keys: [int(k[1:]) for k in keys]
  return SimRun(trainer, session, steps, {s: indices(r["trained"]) for s, r in records.items()},
                {s: indices(r["dropped_stale"]) for s, r in records.items()},
                {s: indices(r["dropped_overdue"]) for s, r in records.items()})
