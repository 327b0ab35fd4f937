"""GRPO group normalisation and branch-local PPO advantages against float64 brute force."""

import statistics

import numpy as np
from hypothesis import given, settings, strategies as st

from clawjax.calllog import RolloutRecord
from clawjax.rl.advantages import grpo_advantages, ppo_advantages
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees

records = st.lists(st.builds(
    lambda i, task, harness, reward, status: RolloutRecord(
        f"r{i}", task, harness, reward if status == "ok" else None, status),
    st.integers(0, 10**9), st.sampled_from(["t1", "t2"]), st.sampled_from(["claude-code", "openclaw"]),
    st.sampled_from([0.0, 0.25, 1.0]) | st.floats(0, 1), st.sampled_from(["ok", "ok", "ok", "failed"])),
    max_size=24, unique_by=lambda r: r.rollout_id)


@given(records, st.sampled_from([1e-6, 1e-2]))
@settings(max_examples=100, deadline=None)
def test_grpo_matches_brute_force(rollouts, eps):
  s = grpo_advantages(rollouts, eps=eps)
  ok = [r for r in rollouts if r.status == "ok"]
  assert sorted(s.rollout_ids) == sorted(r.rollout_id for r in ok)
  index = s.index()
  singletons = zero_var = 0
  for key in {(r.task_id, r.harness) for r in ok}:
    members = [r for r in ok if (r.task_id, r.harness) == key]
    # One group per (task, harness): same task under another harness is another group.
    assert {int(s.group_ids_N[index[r.rollout_id]]) for r in members} == {s.groups.index(key)}
    rewards = [r.reward for r in members]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    singletons += len(members) == 1
    zero_var += len(members) > 1 and len(set(rewards)) == 1
    for r in members:
      want = 0.0 if len(set(rewards)) == 1 else (r.reward - mean) / (std + eps)
      np.testing.assert_allclose(s.advantages_N[index[r.rollout_id]], want, rtol=1e-5, atol=1e-6)
  assert (s.singleton_groups, s.zero_variance_groups) == (singletons, zero_var)
  assert len(s.groups) == len({g for g in s.groups}) == len({(r.task_id, r.harness) for r in ok})


def test_ppo_advantages_are_branch_local_gae():
  rng = np.random.default_rng(0)
  calls = synthetic.agent_rollout(rng, rollout_id="r", n_calls=5, prompt_len=20, tokens_per_call=16,
                                  patterns=("thinking_stripped", "retry"))
  tree = filter_rollout("r", calls).tree
  assert len(tree.leaves_L) > 1
  scores = grpo_advantages([RolloutRecord("r", "t", "h", 0.75, "ok")])
  batch = pack_trees([tree], scores, row_len=tree.size + 5)
  values = rng.normal(size=batch.shape)
  got = ppo_advantages(batch, values.astype(np.float32))
  par, mask = batch.parent_index_RT[0], batch.loss_mask_RT()[0]
  leaves = [i for i in range(tree.size) if batch.subtree_end_RT[0, i] == i + 1]
  seen = set()
  for leaf in leaves:
    path = []
    i = leaf
    while i >= 0:
      path.append(i)
      i = par[i]
    actions = [i for i in reversed(path) if mask[i]]
    # GAE with gamma = lambda = 1 along this trajectory alone; reward R at its last action.
    v = [float(values[0, par[i]]) for i in actions] + [0.0]
    adv = 0.0
    for k in range(len(actions) - 1, -1, -1):
      reward = 0.75 if k == len(actions) - 1 else 0.0
      adv += reward + v[k + 1] - v[k]
      np.testing.assert_allclose(got[0, actions[k]], adv, rtol=1e-5, atol=1e-5)
      seen.add(actions[k])
  assert seen == set(np.flatnonzero(mask).tolist())
  assert (got[0][~mask] == 0).all()
