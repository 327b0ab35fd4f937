"""The statistics of the tables: a percentile bootstrap interval of a mean, and a paired sign-flip
permutation test of two score lists over the same tasks.

Both are defined with their randomness fixed by `seed`, so a table is the same every time it is printed.

bootstrap_interval: resample the values with replacement `samples` times; the interval is the
  ((1 - confidence) / 2, (1 + confidence) / 2) quantiles of the resampled means (numpy's linear
  interpolation). The unit resampled is whatever the caller passes: tables.py passes one score per seed,
  so the interval says how much a repeated run would move the mean.
task_bootstrap_interval: the same for a benchmark's mean over tasks of each task's mean over its
  repeats (seeds), resampled in two stages: the tasks with replacement, then each drawn task's repeats
  with replacement. The interval then says how much the mean would move on another draw of tasks like
  these as well as on a repeated run; with one repeat per task it is the plain bootstrap over tasks.
paired_test: two-sided p-value of "a and b score the same per task" from the per-task differences d: the
  statistic is |mean(d)|, its null distribution flips the sign of each d_i independently (exchangeable
  under the null, whatever the scores' distribution: they are bounded, often 0/1, far from normal).
  Exact over all 2^n sign patterns up to `exact_max` tasks, else `samples` random patterns, counting
  the observed one ((1 + hits) / (1 + samples)) so that p is never 0.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class StatsConfig:
  confidence: float = 0.95   # of the bootstrap interval
  samples: int = 10_000      # bootstrap resamples; sign patterns of the paired test beyond exact_max tasks
  seed: int = 0              # of both
  exact_max: int = 16        # the paired test enumerates all 2^n sign patterns up to this many tasks

  def __post_init__(self):
    if not 0 < self.confidence < 1:
      raise ValueError(f"StatsConfig.confidence must be in (0, 1), got {self.confidence}")
    if self.samples < 1 or self.exact_max < 0:
      raise ValueError(f"StatsConfig.samples must be >= 1 and exact_max >= 0, got {self}")


def bootstrap_interval(values: Sequence[float], config: StatsConfig = StatsConfig()) -> tuple[float, float] | None:
  """The percentile bootstrap interval of the mean of `values`; None for fewer than two values."""
  x = np.asarray(values, np.float64)
  if len(x) < 2:
    return None
  rng = np.random.default_rng(config.seed)
  means = x[rng.integers(0, len(x), size=(config.samples, len(x)))].mean(axis=1)
  alpha = (1 - config.confidence) / 2
  lo, hi = np.quantile(means, [alpha, 1 - alpha])
  return float(lo), float(hi)


def task_bootstrap_interval(per_task: Sequence[Sequence[float]], config: StatsConfig = StatsConfig()
                            ) -> tuple[float, float] | None:
  """The two-stage percentile bootstrap interval of the mean over tasks of each task's mean over its
  repeats (`per_task`: each task's scores, one a repeat); None for fewer than two tasks."""
  if len(per_task) < 2:
    return None
  counts_T = np.array([len(scores) for scores in per_task])
  if counts_T.min() < 1:
    raise ValueError("task_bootstrap_interval: a task has no score")
  values_TK = np.zeros((len(per_task), counts_T.max()))
  for i, scores in enumerate(per_task):
    values_TK[i, :len(scores)] = scores
  rng = np.random.default_rng(config.seed)
  means = []
  for start in range(0, config.samples, _CHUNK):  # (bounds the [samples, tasks, repeats] arrays)
    tasks_ST = rng.integers(0, len(per_task), size=(min(_CHUNK, config.samples - start), len(per_task)))
    counts_ST = counts_T[tasks_ST]
    repeats_STK = (rng.random((*tasks_ST.shape, values_TK.shape[1])) * counts_ST[..., None]).astype(int)
    drawn_STK = values_TK[tasks_ST[..., None], repeats_STK]
    used_STK = np.arange(values_TK.shape[1]) < counts_ST[..., None]  # a task draws as many as it has
    means.append(((drawn_STK * used_STK).sum(-1) / counts_ST).mean(-1))
  alpha = (1 - config.confidence) / 2
  lo, hi = np.quantile(np.concatenate(means), [alpha, 1 - alpha])
  return float(lo), float(hi)


_CHUNK = 1000


def paired_test(a: Sequence[float], b: Sequence[float], config: StatsConfig = StatsConfig()) -> float:
  """Two-sided sign-flip permutation p-value of mean(a - b) = 0, pairs (a_i, b_i) of one task each."""
  x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if x.shape != y.shape or x.ndim != 1:
    raise ValueError(f"paired_test: a and b must be equally long lists, got {len(a)} and {len(b)}")
  d = x - y
  if not len(d):
    raise ValueError("paired_test: no task in common")
  observed = abs(d.mean())
  tol = 1e-12 * max(1.0, observed)  # equal statistics up to rounding count as at least as extreme
  if len(d) <= config.exact_max:
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    return float(np.mean(np.abs(signs @ d / len(d)) >= observed - tol))
  rng = np.random.default_rng(config.seed)
  signs = rng.choice((1.0, -1.0), size=(config.samples, len(d)))
  hits = int(np.sum(np.abs(signs @ d / len(d)) >= observed - tol))
  return (1 + hits) / (1 + config.samples)
