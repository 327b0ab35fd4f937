"""One RL step's data: call log + rollout records -> filtered trees -> advantages -> packed batches.

Which rollouts are trained (each exclusion is counted under its reason in `StepData.counts`):
  status      the rollout record is not "ok" (crashed, timed out, unscored): `status_<status>`;
  no_record   calls without a rollout record (the rollout never finished): `no_record`;
  nonfinite   a reward that is not a finite float never reaches the loss: `nonfinite_reward`;
  stale       a call sampled by a policy more than `max_staleness` versions behind the learner:
              the whole rollout is dropped (`stale`); within the bound, TIS corrects it;
  over_branching, empty: the tree filters dropped every call (`over_branching`, `no_trained_calls`);
  too_long    the kept tree is longer than a packed row (`too_long`).
Calls are counted by their filter reason (`calls_train`, `calls_retry`, ...).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from clawjax.calllog import CallRecord, LoadedLog, RolloutRecord
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree.batch import PackedBatch, RolloutScores
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.pack import pack_trees, split_for_rows


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  row_len: int = 65_536      # tokens per packed row: the longest rollout tree that can be trained
  rows: int = 8              # rows per update (static shape: one compile); more trees -> more updates
  max_staleness: int = 1     # drop rollouts with calls sampled more than this many versions back
  # Store a GRPO group's common task prompt once per packed segment instead of once per rollout
  # (clawjax.tree.pack, `share_prompts`): the same loss and gradients from fewer tokens. Default on;
  # False packs each rollout's tree as its own segment.
  share_prompts: bool = True

  def __post_init__(self):
    if self.row_len < 1 or self.rows < 1 or self.max_staleness < 0:
      raise ValueError(f"BatchConfig: row_len, rows must be >= 1 and max_staleness >= 0, got {self}")


@dataclasses.dataclass
class StepData:
  batches: list[PackedBatch]
  scores: RolloutScores
  counts: dict[str, int]           # exclusions and call reasons, see the module docstring
  rewards: dict[str, float]        # per rollout id (all scored rollouts, trained or not)
  groups: dict[str, tuple[str, str]]  # rollout id -> (task_id, harness)
  tree_stats: dict[str, float]     # unique/path/loss tokens, dedup ratio, leaves, drift


def _staleness(calls: Sequence[CallRecord], version: int) -> int:
  versions = [c.policy_version for c in calls if c.status == "ok" and c.policy_version is not None]
  return version - min(versions) if versions else 0


def build_step(log: LoadedLog, *, policy_version: int, filters: FilterConfig,
               batch: BatchConfig) -> StepData:
  """Everything the learner needs from one step's rollouts (the log of this step only)."""
  counts: collections.Counter[str] = collections.Counter()
  trainable: list[RolloutRecord] = []
  trees: dict[str, CallTree] = {}
  rewards: dict[str, float] = {}
  stats = collections.Counter()
  for rid in log.rollout_ids():
    record = log.rollouts.get(rid)
    calls = log.calls.get(rid, [])
    if record is None:
      counts["no_record"] += 1
      continue
    if record.status != "ok":
      counts[f"status_{record.status}"] += 1
      continue
    if record.reward is None or not math.isfinite(record.reward):
      counts["nonfinite_reward"] += 1
      continue
    rewards[rid] = record.reward
    if _staleness(calls, policy_version) > batch.max_staleness:
      counts["stale"] += 1
      continue
    f = filter_rollout(rid, calls, filters)
    for reason in f.reasons.values():
      counts[f"calls_{reason}"] += 1
    if f.over_branching:
      counts["over_branching"] += 1
      continue
    if not f.tree.size:
      counts["no_trained_calls"] += 1
      continue
    if f.tree.size > batch.row_len:
      counts["too_long"] += 1
      continue
    trees[rid] = f.tree
    trainable.append(record)
    stats["unique_tokens"] += f.tree.size
    stats["path_tokens"] += f.tree.path_tokens()
    stats["loss_tokens"] += int((f.tree.owner_T >= 0).sum())
    stats["leaves"] += f.leaves
    stats["drift_calls"] += f.drift_calls
  scores = grpo_advantages(trainable)
  kept = [trees[rid] for rid in scores.rollout_ids]
  if batch.share_prompts:  # a group's rollouts side by side, so that they land in one update
    kept = [kept[i] for i in np.argsort(scores.group_ids_N, kind="stable")]
  layout = dict(row_len=batch.row_len, rows=batch.rows)
  batches = [pack_trees(part, scores, share_prompts=batch.share_prompts, **layout)
             for part in split_for_rows(kept, scores=scores, share_prompts=batch.share_prompts, **layout)]
  n = max(len(kept), 1)
  tree_stats = {
      "trained_rollouts": float(len(kept)),
      "unique_tokens": float(stats["unique_tokens"]),
      "loss_tokens": float(stats["loss_tokens"]),
      # path tokens / unique tokens: how much the tree layout saves over one row per path.
      "tree_dedup_ratio": stats["path_tokens"] / max(stats["unique_tokens"], 1),
      "leaves_mean": stats["leaves"] / n,
      "drift_calls": float(stats["drift_calls"]),
      "singleton_groups": float(scores.singleton_groups),
      "zero_variance_groups": float(scores.zero_variance_groups),
  }
  groups = {rid: (r.task_id, r.harness) for rid, r in log.rollouts.items()}
  return StepData(batches, scores, dict(counts), rewards, groups, tree_stats)


def reward_metrics(data: StepData) -> dict[str, float]:
  """Mean/std of the reward over all scored rollouts, per harness and per (task, harness) group."""
  out: dict[str, float] = {}

  def add(prefix: str, values: list[float]) -> None:
    out[f"{prefix}mean"] = float(np.mean(values))
    out[f"{prefix}std"] = float(np.std(values))

  if data.rewards:
    add("reward/", list(data.rewards.values()))
  by: dict[str, list[float]] = collections.defaultdict(list)
  for rid, r in data.rewards.items():
    task, harness = data.groups[rid]
    by[f"reward_harness/{harness}/"].append(r)
    by[f"reward_group/{task}/{harness}/"].append(r)
  for prefix, values in sorted(by.items()):
    add(prefix, values)
  return out
