"""GRPO group normalisation and the learner's branch-local PPO advantages against brute force: float64
group statistics, and GAE (gamma = lambda = 1) along each root-to-leaf path with the critic run on that
path alone."""

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from hypothesis import given, settings, strategies as st

from clawjax.calllog import RolloutRecord
from clawjax.models.model import causal_inputs
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.logprobs import gather_rows
from clawjax.rl.losses import LOSSES, TokenInputs
from clawjax.rl.value import ValueHead, values_at
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees
from tests.rl.learner_batches import TINY, make_policy

records = st.lists(st.builds(
    lambda i, task, harness, reward, status, draw: RolloutRecord(
        f"r{i}", task, harness, reward if status == "ok" else None, status,
        {} if draw is None else {"group": draw}),
    st.integers(0, 10**9), st.sampled_from(["t1", "t2"]), st.sampled_from(["claude_code", "openclaw"]),
    st.sampled_from([0.0, 0.25, 1.0]) | st.floats(0, 1), st.sampled_from(["ok", "ok", "ok", "failed"]),
    st.sampled_from([None, 3, 7])),
    max_size=24, unique_by=lambda r: r.rollout_id)


@given(records, st.sampled_from([1e-6, 1e-2]))
@settings(max_examples=100, deadline=None)
def test_grpo_matches_brute_force(rollouts, eps):
  s = grpo_advantages(rollouts, eps=eps)
  ok = [r for r in rollouts if r.status == "ok"]
  assert sorted(s.rollout_ids) == sorted(r.rollout_id for r in ok)
  index = s.index()
  singletons = zero_var = 0
  for key in {(r.task_id, r.harness, r.extra.get("group")) for r in ok}:
    members = [r for r in ok if (r.task_id, r.harness, r.extra.get("group")) == key]
    # One group per draw of a (task, harness) pair: the same task under another harness, or drawn again,
    # is another group.
    assert {int(s.group_ids_N[index[r.rollout_id]]) for r in members} == {s.groups.index(key)}
    rewards = [r.reward for r in members]
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    singletons += len(members) == 1
    zero_var += len(members) > 1 and len(set(rewards)) == 1
    for r in members:
      want = 0.0 if len(set(rewards)) == 1 else (r.reward - mean) / (std + eps)
      np.testing.assert_allclose(s.advantages_N[index[r.rollout_id]], want, rtol=1e-5, atol=1e-6)
  assert (s.singleton_groups, s.zero_variance_groups) == (singletons, zero_var)
  assert len(s.groups) == len(set(s.groups)) == len({(r.task_id, r.harness, r.extra.get("group")) for r in ok})


def test_two_draws_of_one_task_are_two_groups():
  """One step's draw of (t, mini) scored [1, 0, 0], another step's [1, 1, 0], trained in one step: each
  is normalised on its own, not as one group of six (which gives +-1 to all)."""
  rewards = {4: [1.0, 0.0, 0.0], 9: [1.0, 1.0, 0.0]}
  rollouts = [RolloutRecord(f"g{g}-{k}", "t", "mini", r, "ok", {"group": g})
              for g, rs in rewards.items() for k, r in enumerate(rs)]
  s = grpo_advantages(rollouts)
  got = s.by_rollout()
  np.testing.assert_allclose([got[f"g4-{k}"] for k in range(3)], [1.414214, -0.707107, -0.707107], rtol=1e-5)
  np.testing.assert_allclose([got[f"g9-{k}"] for k in range(3)], [0.707107, 0.707107, -1.414214], rtol=1e-5)
  assert s.groups == [("t", "mini", 4), ("t", "mini", 9)]


def test_learner_ppo_advantages_are_branch_local_gae():
  """A_t as the learner forms it (the critic read at each loss token's tree parent, the `ppo` loss's
  R - V_old) equals GAE along each path of a branching tree, the critic run on that path alone."""
  rng = np.random.default_rng(0)
  calls = synthetic.agent_rollout(rng, rollout_id="r", n_calls=5, prompt_len=20, tokens_per_call=16,
                                  patterns=("thinking_stripped", "retry"), vocab_size=TINY.vocab_size)
  tree = filter_rollout("r", calls).tree
  assert len(tree.leaves_L) > 1
  batch = pack_trees([tree], grpo_advantages([RolloutRecord("r", "t", "h", 0.75, "ok")]), row_len=tree.size + 5)
  policy, head = make_policy(), ValueHead(TINY.d_model)
  head.kernel.value = jnp.asarray(rng.normal(size=TINY.d_model), jnp.float32)
  cfg = LearnerConfig(loss="ppo", value=ValueConfig(kind="shared"), logits_chunk=32)
  mb = Learner(cfg, policy, value=head).prepare(batch)
  mb = jax.tree.map(lambda a: np.asarray(a)[0], mb)  # the one micro-batch

  @nnx.jit  # compiled: op-by-op dispatch of a whole model dominates a test this small
  def tree_values(policy, head, mb):
    hidden = policy.hidden(mb.tokens, mb.positions, mb.segment_ids, mb.subtree_end)
    return values_at(head, gather_rows(hidden, mb.pred_index), mb.tokens, mb.positions, mb.segment_ids,
                     mb.subtree_end, mb.pred_index)

  @nnx.jit
  def path_values(policy, head, tokens_BT):
    return head(policy.hidden(*causal_inputs(tokens_BT)))

  values = tree_values(policy, head, mb)
  zeros = jnp.zeros_like(values)
  x = TokenInputs(logp=zeros, logp_old=zeros, logp_rollout=zeros, advantages=jnp.asarray(mb.advantages),
                  returns=jnp.asarray(mb.returns), mask=jnp.asarray(mb.weight > 0), entropy=zeros,
                  values=values, values_old=values)
  got_K = np.asarray(LOSSES["ppo"].fn(x, cfg).metrics["ppo_advantage"])[0]
  mask = batch.loss_mask_RT()[0]
  got = dict(zip(np.flatnonzero(mask).tolist(), got_K[:mask.sum()].tolist()))

  par = batch.parent_index_RT[0]
  leaves = [i for i in range(tree.size) if batch.subtree_end_RT[0, i] == i + 1]
  seen = set()
  for leaf in leaves:
    path, i = [], leaf
    while i >= 0:
      path.append(i)
      i = par[i]
    path = path[::-1]
    # The critic on this path alone, as a plain causal sequence: V(s) after each of its tokens (padded to
    # one length, so that every path runs one program: a causal row's padding at its end changes nothing
    # before it).
    tokens = np.zeros((1, tree.size), np.int32)
    tokens[0, :len(path)] = batch.tokens_RT[0, path]
    v_path = np.asarray(path_values(policy, head, jnp.asarray(tokens)))[0, :len(path)].astype(np.float64)
    actions = [k for k, i in enumerate(path) if mask[i]]
    v = [v_path[k - 1] for k in actions] + [0.0]
    adv = 0.0
    for j in range(len(actions) - 1, -1, -1):
      reward = 0.75 if j == len(actions) - 1 else 0.0
      adv += reward + v[j + 1] - v[j]
      np.testing.assert_allclose(got[path[actions[j]]], adv, rtol=1e-4, atol=1e-4)
      seen.add(path[actions[j]])
  assert seen == set(got)
