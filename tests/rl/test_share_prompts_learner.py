"""The learner on the tree layout with shared group prompts equals the learner on the paths layout.

The shared batch comes from clawjax.tree.pack (the component under test); the paths batch is built from
first principles by learner_batches from the same trees' parent arrays, so a wrong merge (a parent, a
subtree end, a rollout's advantage) changes the loss or the gradients.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees
from tests.rl.learner_batches import TINY, Tree, make_policy, paths_layout, rel_diff

TOL = 1e-5


@pytest.mark.parametrize("normalisation,loss,value", [("unique", "grpo", "none"), ("paths", "ppo", "shared")])
def test_shared_prompt_layout_equals_paths_layout(normalisation, loss, value):
  calls, outcomes = [], []
  for harness, n in (("a", 3), ("b", 2)):  # two groups: sharing within each, never across
    c, o = synthetic.agent_group(np.random.default_rng(11), task_id="t", harness=harness, n_rollouts=n,
                                 prompt_len=40, n_calls=3, tokens_per_call=12, vocab_size=TINY.vocab_size,
                                 patterns=("thinking_stripped", "retry"))
    calls += c
    outcomes += o
  rids = list(dict.fromkeys(c.rollout_id for c in calls))
  trees = [filter_rollout(rid, [c for c in calls if c.rollout_id == rid]).tree for rid in rids]
  scores = grpo_advantages(outcomes)
  # Room for a group's merged trees in one row, not for two groups.
  row_len = -(-max(t.size for t in trees) * 2 // 32) * 32
  shared = pack_trees(trees, scores, row_len=row_len, share_prompts=True)
  assert (shared.segment_ids_RT > 0).sum() < sum(t.size for t in trees) - 3 * 40
  index = scores.index()
  paths = paths_layout([Tree(t.parent_T, t.tokens_T, t.owner_T >= 0, t.logprobs_T,
                             float(scores.advantages_N[index[t.rollout_id]]),
                             float(scores.rewards_N[index[t.rollout_id]])) for t in trees],
                       length=max(int(t.depth_T.max()) + 1 for t in trees))

  cfg = LearnerConfig(loss=loss, normalisation=normalisation, logits_chunk=64, c_bar=1.5, kl_coef=0.05,
                      value=ValueConfig(kind=value))
  learner = Learner(cfg, make_policy(), value=make_value_model(value, TINY.d_model))
  if value != "none":  # a non-zero critic: V(s_t) must be read at the parent, across the shared prompt
    learner.state.params["value"]["kernel"].value = jax.numpy.linspace(-1.0, 1.0, TINY.d_model)
  loss_s, grads_s, _ = learner.loss_and_grads(shared)
  loss_p, grads_p, _ = learner.loss_and_grads(paths)
  assert abs(loss_s - loss_p) <= TOL * abs(loss_p)
  assert rel_diff(grads_s, grads_p) < TOL
