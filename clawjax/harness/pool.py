"""Runs many rollouts at once: the one thread pool behind `run_rollouts`, the RL loop and the evaluator.

A rollout spends its time waiting on a harness process and the engine, so threads suffice. Results come
back in job order; `on_result` sees each in completion order, in the caller's thread (to write it down
as soon as it exists). On an interrupt, queued jobs are dropped and running ones end by their own
timeouts. Progress: a tqdm bar on a terminal; in a log file (stderr not a terminal) a line every
`PROGRESS_LINES`-th of the jobs instead, never a carriage return.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import tqdm

from clawjax import progress as progress_lib

log = logging.getLogger(__name__)
PROGRESS_LINES = 10  # progress lines per batch of jobs when stderr is not a terminal

Job = TypeVar("Job")
Result = TypeVar("Result")


def run_concurrently(fn: Callable[[Job], Result], jobs: Sequence[Job], concurrency: int, *,
                     on_result: Callable[[Result], None] | None = None, desc: str = "",
                     progress: bool = False, score: Callable[[Result], float | None] = lambda r: None,
                     status: Callable[[Result], str] = lambda r: "") -> list[Result]:
  """fn(job) for every job, `concurrency` at a time. With `progress`, a bar shows the mean of
  `score` over finished jobs (None counts as 0) and the `status` of the last one."""
  pool = concurrent.futures.ThreadPoolExecutor(max(1, concurrency))
  try:
    futures = [pool.submit(fn, job) for job in jobs]
    total = 0.0
    lines = progress and not progress_lib.redraws()
    every = max(1, len(jobs) // PROGRESS_LINES)
    with tqdm.tqdm(total=len(jobs), desc=desc, unit="rollout", disable=not progress or lines) as bar:
      for n, fut in enumerate(concurrent.futures.as_completed(futures), start=1):
        result = fut.result()
        if on_result is not None:
          on_result(result)
        total += score(result) or 0.0
        bar.set_postfix(mean_score=f"{total / n:.3f}", last=status(result))
        bar.update()
        if lines and (n % every == 0 or n == len(jobs)):
          log.info("%s: %d/%d rollouts, mean score %.3f, last %s", desc or "rollouts", n, len(jobs), total / n,
                   status(result))
  finally:
    pool.shutdown(wait=True, cancel_futures=True)
  return [f.result() for f in futures]
