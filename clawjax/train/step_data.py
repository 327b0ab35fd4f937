"""One RL step's data: call log + rollout records -> filtered trees -> advantages -> packed batches.

Scored rollouts (status "ok", a finite reward within `reward_range`) form the GRPO groups, one per draw
of a (task, harness) pair (clawjax.rl.advantages): each group's mean and std are taken over all of its
scored rollouts, as the paper defines A_i over the n rollouts of a task, also over those that are then
not trained (dropping them first would change their siblings' advantages: a group [1, 1, 0, 0] whose
failures are too long would train its successes at A = 0).

Which rollouts are trained (each exclusion is counted under its reason in `StepData.counts`):
  unreadable  a record of the rollout could not be read (clawjax.calllog.load names the file and line):
              the rollout is left out whole, not trained on the calls that remain: `unreadable`;
  overdue     every rollout of a group that passed its deadline (`rollout.group_deadline_s`: a record
              with `extra.overdue` stands for each rollout given up), also those that ended in time:
              `overdue` (and the groups: `overdue_groups`);
  status      the rollout record is not "ok" (crashed, timed out, unscored): `status_<status>`;
  no_record   calls without a rollout record (the rollout never finished): `no_record`;
  reward      a reward that is not finite, or outside `reward_range` with `out_of_range="reject"`:
              `nonfinite_reward` / `reward_out_of_range` (never scored, never in a group);
  vocabulary  an ok call whose input or output holds a token id outside the model's vocabulary
              [0, vocab_size) (clawjax.tree.vocab): `token_out_of_vocab`; when that leaves out every
              scored rollout of a step, on every process, the run stops (`has_data`) naming a call;
  stale       a call sampled by a policy more than `max_staleness` versions behind the learner:
              the whole rollout is dropped (`stale`); within the bound, TIS corrects it. A call whose
              engine reports no version cannot be judged: it counts as too old (its rollout is `stale`),
              and is counted (`calls_without_version`) and warned about;
  ahead       a call sampled by a version newer than the learner's (a replica still holding a crashed
              run's later weights after a resume's push passed it over): `version_ahead`;
  over_branching, empty: the tree filters dropped every call (`over_branching`, `no_trained_calls`);
  too_long    the kept tree is longer than a packed row (`too_long`);
  uninformative  with `drop_uninformative_groups` (or dynamic sampling, `min_informative_groups`), a
              rollout of a group whose advantages are all 0 (one rollout, or equal rewards):
              `uninformative`.
`scored_untrained` counts the scored rollouts that were not trained, whatever the reason. Calls are
counted by their filter reason (`calls_train`, `calls_retry`, ...).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from clawjax import distributed
from clawjax.calllog import CallRecord, LoadedLog, RolloutRecord
from clawjax.config import Count, NonNegative
from clawjax.rl.advantages import group_key, grpo_advantages
from clawjax.rl.device_batch import process_share
from clawjax.tree.batch import GroupKey, PackedBatch, RolloutScores
from clawjax.tree.filters import FilterConfig, FilteredRollout, filter_rollout, ok_call_arrays
from clawjax.tree.pack import pack_trees, split_for_rows
from clawjax.tree.vocab import VocabularyError, call_outside, mismatch

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  row_len: Count = 65_536    # tokens per packed row: the longest rollout tree that can be trained
  # Rows per update, over all processes (static shape: one compile); more trees -> more updates.
  rows: Count = 8
  max_staleness: NonNegative[int] = 1  # drop rollouts with calls sampled more than this many versions back
  # Store a GRPO group's common task prompt once per packed segment instead of once per rollout
  # (clawjax.tree.pack, `share_prompts`): the same loss and gradients from fewer tokens. Default on;
  # False packs each rollout's tree as its own segment.
  share_prompts: bool = True
  # The verifiers' scores lie in [0, 1] (ClawGym checkers and rubric); a reward outside is a broken
  # checker. "reject": the rollout is not scored (counted); "clip": it is clipped into the range.
  reward_range: tuple[float, float] = (0.0, 1.0)
  out_of_range: str = "reject"
  # Leave out the rollouts of groups whose advantages are all 0 (a single rollout, or equal rewards).
  # They add no gradient but their tokens count in the loss normaliser N, so off (the paper's GRPO)
  # the step shrinks with the share of such groups; on, they are counted and not trained.
  drop_uninformative_groups: bool = False
  # Dynamic sampling (DAPO, arXiv 2503.14476): a step draws more tasks until it holds this many groups
  # whose rewards differ, over all processes (clawjax.train.dynamic_sampling); groups whose advantages
  # are all 0 are left out and counted, as with drop_uninformative_groups. 0: off.
  min_informative_groups: int = 0
  # The most task samples a step draws with dynamic sampling, its own first one included; then it trains
  # on what it has (counted: sampling/short). Not published by DAPO; verl's recipe allows 10 generation
  # batches, 4 here bounds a step's rollout time at 4 x.
  max_draw_factor: int = 4

  @property
  def drops_uninformative(self) -> bool:
    return self.drop_uninformative_groups or self.min_informative_groups > 0

  def __post_init__(self):
    if self.row_len < 1 or self.rows < 1 or self.max_staleness < 0:
      raise ValueError(f"BatchConfig: row_len, rows must be >= 1 and max_staleness >= 0, got {self}")
    if self.min_informative_groups < 0 or self.max_draw_factor < 1:
      raise ValueError(f"BatchConfig: min_informative_groups must be >= 0 and max_draw_factor >= 1, got "
                       f"{self.min_informative_groups} and {self.max_draw_factor}")
    low, high = self.reward_range
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
      raise ValueError(f"BatchConfig.reward_range={self.reward_range}: must be finite with low < high")
    if self.out_of_range not in ("reject", "clip"):
      raise ValueError(f"BatchConfig.out_of_range={self.out_of_range!r}: 'reject' or 'clip'")


@dataclasses.dataclass
class StepData:
  batches: list[PackedBatch]
  scores: RolloutScores
  counts: dict[str, int]           # exclusions and call reasons, see the module docstring
  rewards: dict[str, float]        # per rollout id (all scored rollouts, trained or not)
  groups: dict[str, GroupKey]      # rollout id -> its GRPO group (task_id, harness, draw)
  tree_stats: dict[str, float]     # sums: trained rollouts, unique/path/loss tokens, leaves, drift, groups
  staleness: dict[int, int] = dataclasses.field(default_factory=dict)  # versions behind -> trained calls
  failures: list[str] = dataclasses.field(default_factory=list)  # failure_reasons of the step's rollouts
  # Per harness: {"rollouts": its rollouts of the step, "failed": {failure_line: count} of those "failed"}
  harnesses: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
  out_of_vocab: str | None = None  # the first call left out for a token id outside the vocabulary


def call_staleness(calls: Sequence[CallRecord], version: int) -> float:
  """How many versions the oldest sampled call of `calls` is behind `version`; infinite when one has no
  version (its engine reports none: its age cannot be bounded, so it is never taken as fresh)."""
  versions = [c.policy_version for c in calls if c.status == "ok"]
  if any(v is None for v in versions):
    return math.inf
  return version - min(versions) if versions else 0


def _reward(record: RolloutRecord, batch: BatchConfig) -> tuple[float | None, str | None]:
  """(the reward to train with, None) or (None, why the rollout has none)."""
  if record.status != "ok":
    return None, f"status_{record.status}"
  if record.reward is None or not math.isfinite(record.reward):
    return None, "nonfinite_reward"
  low, high = batch.reward_range
  if low <= record.reward <= high:
    return record.reward, None
  if batch.out_of_range == "clip":
    return min(max(record.reward, low), high), None
  log.warning("rollout %s (task %s, %s): reward %r is outside %s; not trained (batch.out_of_range)",
              record.rollout_id, record.task_id, record.harness, record.reward, batch.reward_range)
  return None, "reward_out_of_range"


def build_step(loaded: LoadedLog, *, policy_version: int, vocab_size: int, filters: FilterConfig,
               batch: BatchConfig) -> StepData:
  """Everything the learner needs from one step's rollouts (the log of this step only), for a model
  of `vocab_size` tokens."""
  counts: collections.Counter[str] = collections.Counter()
  scored: list[RolloutRecord] = []
  kept_filter: dict[str, FilteredRollout] = {}
  out_of_vocab = None
  for rid, problem in sorted(loaded.excluded.items()):
    counts["unreadable"] += 1
    log.warning("rollout %s left out: a record could not be read: %s", rid, problem)
  overdue = {group_key(r) for r in loaded.rollouts.values() if (r.extra or {}).get("overdue")}
  if overdue:
    counts["overdue_groups"] = len(overdue)
  for rid in loaded.rollout_ids():
    record = loaded.rollouts.get(rid)
    calls = loaded.calls.get(rid, [])
    if record is None:
      counts["no_record"] += 1
      continue
    if group_key(record) in overdue:
      counts["overdue"] += 1
      continue
    reward, why = _reward(record, batch)
    if why:
      counts[why] += 1
      continue
    scored.append(dataclasses.replace(record, reward=reward))
    arrays = ok_call_arrays(calls)
    bad = call_outside(arrays, vocab_size)
    if bad:
      counts["token_out_of_vocab"] += 1
      out_of_vocab = out_of_vocab or mismatch(f"call {bad[0]} of rollout {rid}", bad[1], vocab_size)
      continue
    counts["calls_without_version"] += sum(c.status == "ok" and c.policy_version is None for c in calls)
    if call_staleness(calls, policy_version) > batch.max_staleness:
      counts["stale"] += 1
      continue
    newest = max((c.policy_version for c in calls if c.status == "ok"), default=None)
    if newest is not None and newest > policy_version:
      counts["version_ahead"] += 1
      log.warning("rollout %s: a call sampled by policy version %d, ahead of the learner's %d (an engine holding "
                  "later weights); not trained", rid, newest, policy_version)
      continue
    f = filter_rollout(rid, calls, filters, arrays)
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
    kept_filter[rid] = f
  if counts["calls_without_version"]:
    log.warning("%d calls carry no policy version (their engine reports none): their rollouts are not trained, "
                "as stale", counts["calls_without_version"])
  scores = grpo_advantages(scored)
  kept_ids = [rid for rid in scores.rollout_ids if rid in kept_filter]
  informative = set(scores.group_ids_N[scores.advantages_N != 0].tolist())
  group_of = dict(zip(scores.rollout_ids, scores.group_ids_N.tolist()))
  if batch.drops_uninformative:
    counts["uninformative"] = sum(group_of[rid] not in informative for rid in kept_ids)
    kept_ids = [rid for rid in kept_ids if group_of[rid] in informative]
  trained_groups = {group_of[rid] for rid in kept_ids}
  counts["scored_untrained"] = len(scored) - len(kept_ids)
  kept = [kept_filter[rid].tree for rid in kept_ids]
  if batch.share_prompts:  # a group's rollouts side by side, so that they land in one update
    index = scores.index()
    kept = [kept[i] for i in np.argsort([scores.group_ids_N[index[t.rollout_id]] for t in kept], kind="stable")]
  # batch.rows is the global batch's: this process packs its own groups into its share of the rows.
  share = process_share(batch.rows, distributed.process_count(), distributed.process_index())
  layout = dict(row_len=batch.row_len, rows=share)
  batches = [pack_trees(part, scores, share_prompts=batch.share_prompts, **layout)
             for part in split_for_rows(kept, scores=scores, share_prompts=batch.share_prompts, **layout)]
  tree_stats = {  # sums, so that processes' steps add up (step_metrics derives the ratios)
      "trained_rollouts": float(len(kept)),
      "unique_tokens": float(sum(t.size for t in kept)),
      "path_tokens": float(sum(t.path_tokens() for t in kept)),
      "loss_tokens": float(sum(t.loss_tokens for t in kept)),
      "leaves": float(sum(kept_filter[rid].leaves for rid in kept_ids)),
      "drift_calls": float(sum(kept_filter[rid].drift_calls for rid in kept_ids)),
      "route_disagree": float(sum(t.route_disagree for t in kept)),
      "singleton_groups": float(scores.singleton_groups),
      "zero_variance_groups": float(scores.zero_variance_groups),
      # Groups with a trained rollout, and those of them whose advantages are all 0 (no signal).
      "trained_groups": float(len(trained_groups)),
      "trained_uninformative_groups": float(len(trained_groups - informative)),
  }
  groups = {rid: group_key(r) for rid, r in loaded.rollouts.items()}
  rewards = {r.rollout_id: r.reward for r in scored}
  # (A kept rollout's calls all have a version: an unversioned call made its rollout stale.)
  staleness = collections.Counter(policy_version - c.policy_version for rid in kept_ids
                                  for c in loaded.calls.get(rid, []) if c.status == "ok")
  if out_of_vocab:
    log.warning("%d rollouts not trained: %s", counts["token_out_of_vocab"], out_of_vocab)
  return StepData(batches, scores, dict(counts), rewards, groups, tree_stats, dict(sorted(staleness.items())),
                  failure_reasons(loaded), harness_outcomes(loaded), out_of_vocab)


def has_data(data: StepData, step: int) -> bool:
  """Whether any process has a rollout of the step to train (every process calls it, with its own
  data). A step whose every scored rollout, on every process, holds a token id the model cannot read
  stops the run: running it again would sample more of the same."""
  parts = distributed.allgather_json({"trained": data.tree_stats["trained_rollouts"], "scored": len(data.rewards),
                                      "out_of_vocab": data.counts.get("token_out_of_vocab", 0),
                                      "example": data.out_of_vocab})
  unreadable = sum(p["out_of_vocab"] for p in parts)
  if unreadable and unreadable == sum(p["scored"] for p in parts):
    example = next(p["example"] for p in parts if p["example"])
    raise VocabularyError(f"step {step}: none of its {unreadable} scored rollouts can be read by the learner's "
                          f"model; {example}: the engine and the learner probably serve different models "
                          f"(the engine's model vs config.model.init)")
  return sum(p["trained"] for p in parts) > 0


def failure_line(record: RolloutRecord) -> str:
  """Why a rollout that is not ok failed, in one line: its status, the runner's reason with the
  harness's last words (its JSON result's error, or its last stderr line: where "Prompt is too long" or
  a ModuleNotFoundError inside a sandbox shows), and that stderr line where the reason lacks it."""
  extra = record.extra or {}
  stderr = [line.strip() for line in str(extra.get("stderr_tail") or "").splitlines() if line.strip()]
  reason = str(extra.get("reason") or "no reason recorded")
  parts = [record.status, reason]
  if stderr and stderr[-1][:300] not in reason:
    parts.append(f"stderr: {stderr[-1][:300]}")
  return "; ".join(parts)


def failure_reasons(loaded: LoadedLog, limit: int = 5) -> list[str]:
  """Why the rollouts of a step failed (`failure_line`), most frequent first, with counts."""
  reasons = collections.Counter(failure_line(r) for r in loaded.rollouts.values() if r.status != "ok")
  reasons.update(f"unreadable: {problem}" for problem in loaded.excluded.values())
  return [f"{n} x {reason}" for reason, n in reasons.most_common(limit)]


def harness_outcomes(loaded: LoadedLog) -> dict[str, dict[str, Any]]:
  """StepData.harnesses of a step's log."""
  out: dict[str, dict[str, Any]] = {}
  for record in loaded.rollouts.values():
    o = out.setdefault(record.harness, {"rollouts": 0, "failed": {}})
    o["rollouts"] += 1
    if record.status == "failed":
      line = failure_line(record)
      o["failed"][line] = o["failed"].get(line, 0) + 1
  return out


def summary(data: StepData) -> dict[str, Any]:
  """What a step's metrics are made of, as JSON: each process of a multi-process run has its own, and
  `step_metrics` merges them."""
  return {"rewards": data.rewards, "groups": {rid: list(g) for rid, g in data.groups.items() if rid in data.rewards},
          "counts": data.counts, "tree": data.tree_stats, "staleness": {str(k): v for k, v in data.staleness.items()},
          "failures": data.failures, "harnesses": data.harnesses}


def step_metrics(summaries: Sequence[dict[str, Any]]) -> dict[str, float]:
  """The rollout-side metrics of a step from its processes' summaries: reward mean/std over all scored
  rollouts, per harness and per (task, harness) pair (its std: the mean over the step's draws of the pair
  of each draw's std, the spread its advantages were normalised by); exclusions and calls by reason; tree
  sizes and ratios; the staleness histogram of the trained calls."""
  out: dict[str, float] = {}
  rewards = {rid: r for s in summaries for rid, r in s["rewards"].items()}
  groups = {rid: tuple(g) for s in summaries for rid, g in s["groups"].items()}

  def add(prefix: str, values: list[float]) -> None:
    out[f"{prefix}mean"] = float(np.mean(values))
    out[f"{prefix}std"] = float(np.std(values))

  if rewards:
    add("reward/", list(rewards.values()))
  by_harness: dict[str, list[float]] = collections.defaultdict(list)
  by_draw: dict[tuple[str, str, int | None], list[float]] = collections.defaultdict(list)
  for rid, r in rewards.items():
    by_harness[groups[rid][1]].append(r)
    by_draw[groups[rid]].append(r)
  for harness, values in sorted(by_harness.items()):
    add(f"reward_harness/{harness}/", values)
  by_pair: dict[tuple[str, str], list[list[float]]] = collections.defaultdict(list)
  for (task, harness, _), values in by_draw.items():
    by_pair[task, harness].append(values)
  for (task, harness), draws in sorted(by_pair.items()):
    out[f"reward_group/{task}/{harness}/mean"] = float(np.mean([r for d in draws for r in d]))
    out[f"reward_group/{task}/{harness}/std"] = float(np.mean([np.std(d) for d in draws]))
  counts = collections.Counter()
  tree = collections.Counter()
  staleness = collections.Counter()
  for s in summaries:
    counts.update(s["counts"])
    tree.update(s["tree"])
    staleness.update(s["staleness"])
  out.update({f"count/{k}": float(v) for k, v in sorted(counts.items())})
  out.update({k: float(tree[k]) for k in ("trained_rollouts", "unique_tokens", "loss_tokens", "drift_calls",
                                          "singleton_groups", "zero_variance_groups", "trained_groups")})
  # The share of the trained groups that carry no signal (one rollout, or equal rewards): what dynamic
  # sampling (batch.min_informative_groups) brings to 0.
  out["uninformative_trained_share"] = tree["trained_uninformative_groups"] / max(tree["trained_groups"], 1)
  # path tokens / unique tokens: how much the tree layout saves over one row per path.
  out["tree_dedup_ratio"] = tree["path_tokens"] / max(tree["unique_tokens"], 1)
  out["leaves_mean"] = tree["leaves"] / max(tree["trained_rollouts"], 1)
  out["rollouts_ok"] = float(len(rewards))
  out["over_branching_rate"] = counts.get("over_branching", 0) / max(len(rewards), 1)
  # Tree tokens two kept calls' engines routed differently (clawjax.tree.build): engine nondeterminism.
  out["routing/cross_call_disagree"] = float(tree["route_disagree"])
  out.update({f"staleness/{k}": float(v) for k, v in sorted(staleness.items(), key=lambda kv: int(kv[0]))})
  return out
