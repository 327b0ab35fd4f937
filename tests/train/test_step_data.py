"""One step's data: exclusions are counted, GRPO groups are (task, harness) pairs, advantages reach the
packed tokens. Checked against a float64 numpy reference of Eq. 1."""
from __future__ import annotations

import dataclasses

import numpy as np

from clawjax.calllog import LoadedLog
from clawjax.train.step_data import BatchConfig, build_step, reward_metrics
from clawjax.tree.filters import FilterConfig
from clawjax.tree.synthetic import agent_group

SMALL = dict(prompt_len=60, n_calls=3, tokens_per_call=20, vocab_size=500)


def _log(groups) -> LoadedLog:
  calls, rollouts = {}, {}
  for cs, outs in groups:
    for c in cs:
      calls.setdefault(c.rollout_id, []).append(c)
    rollouts.update({o.rollout_id: o for o in outs})
  return LoadedLog(calls=calls, rollouts=rollouts, problems=[])


def _reference(rewards: list[float]) -> np.ndarray:
  r = np.asarray(rewards, np.float64)
  return (r - r.mean()) / (r.std() + 1e-6)


def _token_advantages(data) -> dict[str, set[float]]:
  """rollout id -> the set of advantages its loss tokens carry in the packed batches."""
  out: dict[str, set[float]] = {}
  for b in data.batches:
    mask = b.loss_mask_RT()
    for r, t in zip(*np.nonzero(mask)):
      out.setdefault(b.rollout_ids_N[b.rollout_index_RT[r, t]], set()).add(float(b.advantages_RT[r, t]))
  return out


def test_mix_harness_groups_never_mix():
  rng = np.random.default_rng(0)
  ra, rb = [0.0, 1.0, 0.5, 1.0], [1.0, 1.0, 0.0, 0.25]
  log = _log([agent_group(rng, task_id="t", harness="openclaw", n_rollouts=4, rewards=ra, **SMALL),
              agent_group(rng, task_id="t", harness="claude_code", n_rollouts=4, rewards=rb, **SMALL)])
  data = build_step(log, policy_version=0, filters=FilterConfig(), batch=BatchConfig(row_len=4096, rows=4))
  assert sorted(data.scores.groups) == [("t", "claude_code"), ("t", "openclaw")]
  got = _token_advantages(data)
  for harness, rewards in (("openclaw", ra), ("claude_code", rb)):
    for i, a in enumerate(_reference(rewards)):
      (value,) = got[f"t/{harness}/{i}"]  # every loss token of a rollout carries its one advantage
      np.testing.assert_allclose(value, a, rtol=1e-5, atol=1e-6)
  m = reward_metrics(data)
  np.testing.assert_allclose(m["reward_harness/openclaw/mean"], np.mean(ra))
  np.testing.assert_allclose(m["reward_group/t/claude_code/std"], np.std(rb))


def test_excluded_rollouts_are_counted_and_never_trained():
  rng = np.random.default_rng(1)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=8,
                            rewards=[0.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.9], **SMALL)
  outs[1] = dataclasses.replace(outs[1], status="failed", reward=None)
  outs[2] = dataclasses.replace(outs[2], status="timeout", reward=None)
  outs[3] = dataclasses.replace(outs[3], reward=float("nan"))
  stale = {outs[4].rollout_id}
  calls = [dataclasses.replace(c, policy_version=3 if c.rollout_id in stale else 5) for c in calls]
  log = _log([(calls, outs[:7])])  # outs[7]: calls but no rollout record (never finished)
  data = build_step(log, policy_version=5, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4, max_staleness=1))
  assert data.counts["status_failed"] == 1 and data.counts["status_timeout"] == 1
  assert data.counts["nonfinite_reward"] == 1 and data.counts["stale"] == 1
  assert data.counts["no_record"] == 1
  trained = {rid for b in data.batches for rid in b.rollout_ids_N}
  assert trained == {outs[i].rollout_id for i in (0, 5, 6)}
  for i, a in zip((0, 5, 6), _reference([0.0, 0.5, 0.2])):
    np.testing.assert_allclose(_token_advantages(data)[outs[i].rollout_id].pop(), a, rtol=1e-5)
  assert all(np.isfinite(b.advantages_RT).all() and np.isfinite(b.returns_RT).all() for b in data.batches)


def test_tree_longer_than_a_row_is_counted_not_fatal():
  rng = np.random.default_rng(2)
  log = _log([agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[0.0, 1.0], **SMALL)])
  data = build_step(log, policy_version=0, filters=FilterConfig(), batch=BatchConfig(row_len=32, rows=2))
  assert data.counts["too_long"] == 2 and not data.batches
