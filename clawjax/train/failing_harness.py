"""A harness that cannot work in this run stops it, saying why.

At the start, a harness whose known minimum context exceeds the run's stops it before anything runs
(clawjax.harness.adapters.context_problem, checked with the config). What no config check can see (a
missing dependency, a refusal of the harness's own) shows in the rollouts: a harness that fails every
one of its rollouts of a step (two or more, status "failed") for one same reason, `failing_harness_steps`
steps in a row (1 by default; 0: never), stops the run once the last of them is trained and checkpointed
(its other harnesses' rollouts are not lost; a rerun resumes after it), with one line naming the harness
and its reason, the harness's own last words included. A step with nothing to train at all (that harness
the only one) goes by `empty_step_retries` instead.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from clawjax.config import ConfigError


class HarnessFailedError(ConfigError):
  """A harness of config.harnesses cannot work in this run (a ConfigError: the script ends with its line)."""


class FailingHarnesses:
  """Counts, per harness, the steps in a row in which it failed every one of its rollouts the same way;
  `check` gives the stop's line once one reaches `steps` (0: never)."""

  def __init__(self, steps: int):
    self.steps = steps
    self.streak: collections.Counter[str] = collections.Counter()

  def check(self, summaries: Sequence[dict[str, Any]], step: int) -> str | None:
    """After step `step`, from every process's step summary (clawjax.train.step_data.summary): the same
    answer on every process."""
    failing = failing_every_rollout(summaries)
    self.streak = collections.Counter({h: self.streak[h] + 1 for h in failing})
    for harness, (n, reason) in sorted(failing.items()):
      if self.steps and self.streak[harness] >= self.steps:
        in_a_row = f" ({self.streak[harness]} steps in a row)" if self.streak[harness] > 1 else ""
        return (f"config.harnesses: {harness} failed every one of its {n} rollouts of step {step} the same way "
                f"({reason}){in_a_row}, so it cannot work in this run; fix that, or leave {harness} out (step "
                f"{step} was trained and checkpointed)")
    return None


def failing_every_rollout(summaries: Sequence[dict[str, Any]]) -> dict[str, tuple[int, str]]:
  """harness -> (its rollouts, their one reason) for each harness that failed every one of its rollouts of
  the step (two or more, status "failed") for one same reason."""
  rollouts: collections.Counter[str] = collections.Counter()
  failed: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
  for s in summaries:
    for harness, o in s["harnesses"].items():
      rollouts[harness] += o["rollouts"]
      failed[harness].update(o["failed"])
  return {harness: (n, next(iter(failed[harness]))) for harness, n in rollouts.items()
          if n >= 2 and len(failed[harness]) == 1 and sum(failed[harness].values()) == n}
