"""Benchmark scores from per-task results: the paper's "mean final score in percent", per category too.

A rollout's score is its final score (0.7 code + 0.3 rubric for hybrid tasks, else the code score).
A rollout without one counts as 0: a harness that timed out, an infrastructure failure ("failed";
rerun those with a resumed run before reporting), or a rollout with no score ("error"). For "error",
`unscored` chooses instead: "code" scores a hybrid task that was not judged (no judge configured) by
its code score alone; "exclude" leaves it out of the mean. A task's score is the mean over its
rollouts (`num_samples`); a benchmark's or category's score is the plain mean over its tasks.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable

from clawjax.evaluation.results import STATUSES, TaskResult

UNSCORED_CHOICES = ("zero", "code", "exclude")
ALL = "all"


@dataclasses.dataclass(frozen=True)
class GroupScore:
  name: str  # a category, or ALL
  tasks: int  # tasks that count in `score`
  rollouts: int  # every rollout of the group, whatever its status
  statuses: dict[str, int]  # rollouts per status
  score: float | None  # mean task score in percent; None when no task counts

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class BenchmarkScore:
  overall: GroupScore
  categories: dict[str, GroupScore]  # sorted by category name

  def to_json(self) -> dict:
    return {"overall": self.overall.to_json(),
            "categories": {k: v.to_json() for k, v in self.categories.items()}}


def rollout_score(r: TaskResult, unscored: str = "zero") -> float | None:
  """The rollout's score in [0, 1], or None when it is excluded (see the module docstring)."""
  if unscored not in UNSCORED_CHOICES:
    raise ValueError(f"unscored={unscored!r}: expected one of {UNSCORED_CHOICES}")
  if r.final_score is not None:
    return r.final_score
  if r.status == "error" and unscored == "code" and r.code_score is not None:
    return r.code_score
  if r.status == "error" and unscored == "exclude":
    return None
  return 0.0


def task_scores(results: Iterable[TaskResult], unscored: str = "zero") -> dict[str, float]:
  """Each task's score in [0, 1]: the mean over its rollouts that count (tasks with none are left out)."""
  by_task: dict[str, list[float]] = defaultdict(list)
  for r in results:
    s = rollout_score(r, unscored)
    by_task.setdefault(r.task_id, [])
    if s is not None:
      by_task[r.task_id].append(s)
  return {t: sum(v) / len(v) for t, v in by_task.items() if v}


def _group(name: str, by_task: dict[str, list[TaskResult]], unscored: str) -> GroupScore:
  statuses = Counter({s: 0 for s in STATUSES})
  for rollouts in by_task.values():
    statuses.update(r.status for r in rollouts)
  scores = task_scores((r for rollouts in by_task.values() for r in rollouts), unscored)
  mean = 100.0 * sum(scores.values()) / len(scores) if scores else None
  return GroupScore(name, len(scores), sum(statuses.values()), dict(statuses), mean)


def _mean_group(groups: list[GroupScore]) -> GroupScore:
  scored = [g.score for g in groups if g.score is not None]
  statuses = Counter({s: 0 for s in STATUSES})
  for g in groups:
    statuses.update(g.statuses)
  return GroupScore(groups[0].name, max(g.tasks for g in groups), sum(g.rollouts for g in groups), dict(statuses),
                    sum(scored) / len(scored) if scored else None)


def mean_over_seeds(scores: list[BenchmarkScore]) -> BenchmarkScore:
  """Repeated runs (seeds) of one benchmark as one: each score the mean of the seeds' scores, rollouts
  and statuses summed, tasks the most any seed counted."""
  if len(scores) == 1:
    return scores[0]
  names = sorted({c for s in scores for c in s.categories})
  return BenchmarkScore(
      overall=_mean_group([s.overall for s in scores]),
      categories={c: _mean_group([s.categories[c] for s in scores if c in s.categories]) for c in names})


def summarize(results: Iterable[TaskResult], unscored: str = "zero") -> BenchmarkScore:
  """Scores of one benchmark run; pass one record per (task, sample) (results.latest)."""
  by_task: dict[str, list[TaskResult]] = defaultdict(list)
  for r in results:
    by_task[r.task_id].append(r)
  by_category: dict[str, dict[str, list[TaskResult]]] = defaultdict(dict)
  for task_id, rollouts in by_task.items():
    by_category[rollouts[0].category][task_id] = rollouts
  return BenchmarkScore(
      overall=_group(ALL, by_task, unscored),
      categories={c: _group(c, by_category[c], unscored) for c in sorted(by_category)})
