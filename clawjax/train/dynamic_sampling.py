"""Dynamic sampling (DAPO, arXiv 2503.14476): a step draws more tasks until it holds enough groups that
carry a learning signal.

A GRPO group whose rewards are all equal (or of one rollout) has advantages 0: it adds no gradient, only
tokens to the loss normaliser. With `batch.min_informative_groups` > 0 such groups are left out of the
batch (counted as `uninformative`, clawjax.train.step_data), and after a step's task sample the loop
counts the groups it trains, over every process; while they are fewer than the minimum and the step has
drawn fewer than `batch.max_draw_factor` samples, it draws another sample of the step (its draw k, a
function of (seed, step, k): clawjax.train.groups.step_groups), runs its rollouts and builds the step's
data from every draw so far. At the cap it trains on what it has, and says so (`sampling/short`).
Both loops do it: the synchronous one (clawjax.train.sync_loop) runs each draw's rollouts like the step's
own; the asynchronous one (clawjax.train.async_loop) runs a step's further draws at once, fresh, beside
the groups in flight for later steps.

Metrics of a step: `sampling/draws` (samples drawn, the first included), `sampling/tasks_drawn` (tasks
over every draw and process), `groups/drawn`, `sampling/informative_groups` (the groups trained, all
informative) and, with dynamic sampling on, `sampling/short` (1: the cap came first); beside them the
step data's `uninformative_trained_share`, which dynamic sampling keeps at 0.
"""

from __future__ import annotations

from clawjax import distributed
from clawjax.train.step_data import BatchConfig, StepData


def informative_groups(data: StepData) -> int:
  """This process's trained groups whose advantages are not all 0."""
  return int(data.tree_stats["trained_groups"] - data.tree_stats["trained_uninformative_groups"])


def draw_again(batch: BatchConfig, data: StepData, draws: int) -> bool:
  """Whether the step draws another task sample, after `draws` of them: dynamic sampling is on, every
  process's informative groups together are fewer than the minimum, and the cap is not reached. Every
  process calls it at the same point (it gathers their counts), and they all decide alike."""
  if not batch.min_informative_groups:
    return False
  have = sum(distributed.allgather_json(informative_groups(data)))
  return have < batch.min_informative_groups and draws < batch.max_draw_factor


def sampling_metrics(batch: BatchConfig, data: StepData, draws: int, groups_drawn: int, harnesses: int
                     ) -> dict[str, float]:
  """This process's share of the step's sampling metrics (they add up over processes, except draws and
  short, the same on every process)."""
  out = {"sampling/draws": float(draws), "groups/drawn": float(groups_drawn),
         "sampling/tasks_drawn": groups_drawn / harnesses, "sampling/informative_groups": float(informative_groups(data))}
  if batch.min_informative_groups:
    out["sampling/short"] = float(sum(distributed.allgather_json(informative_groups(data)))
                                  < batch.min_informative_groups)
  return out
