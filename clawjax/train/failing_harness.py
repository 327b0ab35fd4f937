"""A harness that cannot work in this run stops it, saying why.

At the start, a harness whose known minimum context exceeds the run's stops it before anything runs
(clawjax.harness.adapters.context_problem, checked with the config). What no config check can see (a
missing dependency, a refusal of the harness's own) shows in the rollouts: a harness that fails every
one of its rollouts of a step (two or more, status "failed") for one same reason stops the run once the
step is trained and checkpointed (its other harnesses' rollouts are not lost; a rerun resumes after it),
with one line naming the harness and its reason, the harness's own last words included. A step with
nothing to train at all (that harness the only one) goes by `empty_step_retries` instead.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from clawjax.config import ConfigError


class HarnessFailedError(ConfigError):
  """A harness of config.harnesses cannot work in this run (a ConfigError: the script ends with its line)."""


def failing_harness(summaries: Sequence[dict[str, Any]], step: int) -> str | None:
  """The stop's line when a harness failed every one of its rollouts of the step for one same reason,
  over every process's step summary (clawjax.train.step_data.summary); else None."""
  rollouts: collections.Counter[str] = collections.Counter()
  failed: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
  for s in summaries:
    for harness, o in s["harnesses"].items():
      rollouts[harness] += o["rollouts"]
      failed[harness].update(o["failed"])
  for harness, n in sorted(rollouts.items()):
    if n >= 2 and len(failed[harness]) == 1 and sum(failed[harness].values()) == n:
      (reason,) = failed[harness]
      return (f"config.harnesses: {harness} failed every one of its {n} rollouts of step {step} the same way "
              f"({reason}), so it cannot work in this run; fix that, or leave {harness} out (step {step} was "
              f"trained and checkpointed)")
  return None
