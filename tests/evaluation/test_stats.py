"""The tables' statistics against independent references: the bootstrap interval against the exact
bootstrap distribution (every resample enumerated), the paired test against scipy's permutation test and
against a hand enumeration of sign patterns; the two-stage bootstrap over tasks and seeds against its own
exact distribution."""

import itertools

import numpy as np
import pytest
from scipy import stats as scipy_stats

from clawjax.evaluation.stats import StatsConfig, bootstrap_interval, paired_test, task_bootstrap_interval


def exact_bootstrap_quantile(values, q):
  """The q-quantile of the mean over all n^n equally likely resamples (the exact bootstrap)."""
  means = sorted(np.mean(c) for c in itertools.product(values, repeat=len(values)))
  return np.quantile(means, q)


@pytest.mark.parametrize("values", [[61.0, 55.5, 70.25, 58.0, 64.5], [0.0, 0.0, 100.0, 50.0, 25.0]])
def test_bootstrap_interval_matches_the_exact_bootstrap(values):
  lo, hi = bootstrap_interval(values, StatsConfig(samples=20_000))
  # Monte Carlo over 20,000 resamples: the 2.5% quantile lands between the exact 2% and 3% quantiles.
  assert exact_bootstrap_quantile(values, 0.02) <= lo <= exact_bootstrap_quantile(values, 0.03)
  assert exact_bootstrap_quantile(values, 0.97) <= hi <= exact_bootstrap_quantile(values, 0.98)
  assert bootstrap_interval(values[:1]) is None
  assert bootstrap_interval(values) == bootstrap_interval(values)  # seeded: the same table every time


def test_paired_test_matches_scipy_and_enumeration():
  rng = np.random.default_rng(1)
  a = rng.integers(0, 2, 12).astype(float)
  b = np.clip(a - rng.integers(0, 2, 12) * 0.5, 0, 1)
  ref = scipy_stats.permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                                     alternative="two-sided", n_resamples=np.inf)
  assert paired_test(a, b) == pytest.approx(ref.pvalue)
  # Beyond exact_max: random sign patterns, within Monte Carlo error of the exact p.
  a18, b18 = rng.uniform(size=18), rng.uniform(size=18)
  b18[:9] -= 0.2
  exact = paired_test(a18, b18, StatsConfig(exact_max=18))
  sampled = paired_test(a18, b18, StatsConfig(exact_max=0, samples=20_000))
  assert abs(sampled - exact) < 4 * np.sqrt(exact * (1 - exact) / 20_000) + 1e-4
  assert paired_test([0.5, 0.5], [0.5, 0.5]) == 1.0
  with pytest.raises(ValueError, match="equally long"):
    paired_test([1.0], [1.0, 0.0])


def exact_task_bootstrap_quantile(per_task, q):
  """The q-quantile (the least mean whose probability to be reached is q) of the two-stage resample's
  mean over every outcome: n tasks drawn with replacement (each of the n^n draws equally likely), then
  each drawn task's k repeats with replacement (each of its k^k draws equally likely)."""
  resamples = [[np.mean(c) for c in itertools.product(v, repeat=len(v))] for v in per_task]
  outcomes = []  # (mean, probability)
  for tasks in itertools.product(range(len(per_task)), repeat=len(per_task)):
    p = 1.0 / len(per_task) ** len(per_task) / np.prod([len(resamples[t]) for t in tasks])
    outcomes += [(np.mean(ms), p) for ms in itertools.product(*(resamples[t] for t in tasks))]
  outcomes.sort()
  cdf = np.cumsum([p for _, p in outcomes])
  return outcomes[int(np.searchsorted(cdf, q - 1e-12))][0]


def test_task_bootstrap_matches_its_exact_distribution():
  per_task = [[1.0, 0.0], [0.5, 0.75], [0.0, 0.25, 1.0]]  # three tasks, two or three seeds each
  lo, hi = task_bootstrap_interval(per_task, StatsConfig(samples=20_000))
  assert exact_task_bootstrap_quantile(per_task, 0.02) <= lo <= exact_task_bootstrap_quantile(per_task, 0.03)
  assert exact_task_bootstrap_quantile(per_task, 0.97) <= hi <= exact_task_bootstrap_quantile(per_task, 0.98)
  # One seed per task: the plain bootstrap over tasks (its exact distribution).
  values = [0.0, 0.25, 1.0, 1.0, 0.5]
  lo, hi = task_bootstrap_interval([[v] for v in values], StatsConfig(samples=20_000))
  assert exact_bootstrap_quantile(values, 0.02) <= lo <= exact_bootstrap_quantile(values, 0.03)
  assert exact_bootstrap_quantile(values, 0.97) <= hi <= exact_bootstrap_quantile(values, 0.98)
  assert task_bootstrap_interval([[0.5, 1.0]]) is None
  assert task_bootstrap_interval(per_task) == task_bootstrap_interval(per_task)
  with pytest.raises(ValueError, match="no score"):
    task_bootstrap_interval([[1.0], []])
