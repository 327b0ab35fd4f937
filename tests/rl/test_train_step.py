"""The jitted train step on a real (one-layer) Decoder: layout, accumulation and sharding invariances, and
the whole loss pipeline against an independent float64 reference."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.config import ConfigError
from clawjax.models.model import Decoder
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.losses import LOSSES, LossTerms, register_loss
from clawjax.rl.value import make_value_model
from tests.rl.learner_batches import TINY, make_policy, paths_layout, random_tree, rel_diff, tree_layout

TOL = 1e-5


def _trees(seed: int, n: int = 3, size: int = 50):
  rng = np.random.default_rng(seed)
  return [random_tree(rng, size, TINY.vocab_size) for _ in range(n)]


@pytest.mark.parametrize("normalisation,loss,value", [("unique", "grpo", "none"), ("paths", "ppo", "shared")])
def test_tree_layout_equals_paths_layout(normalisation, loss, value):
  trees = _trees(1)
  cfg = LearnerConfig(loss=loss, normalisation=normalisation, logits_chunk=32, c_bar=1.5, kl_coef=0.05,
                      value=ValueConfig(kind=value))
  learner = Learner(cfg, make_policy(), value=make_value_model(value, TINY.d_model))
  # A non-zero critic, so that V(s_t) really is read at the parent position in both layouts.
  if value != "none":
    learner.state.params["value"]["kernel"].value = jax.numpy.linspace(-1.0, 1.0, TINY.d_model)
  loss_t, grads_t, m_t = learner.loss_and_grads(tree_layout(trees, rows=2, length=128))
  loss_p, grads_p, m_p = learner.loss_and_grads(paths_layout(trees, length=64))
  assert abs(loss_t - loss_p) <= TOL * abs(loss_p)
  assert rel_diff(grads_t, grads_p) < TOL
  for name in ("entropy", "tis_truncated_fraction", "mean_abs_logp_old_minus_rollout", "policy_loss"):
    assert m_t[name] == pytest.approx(m_p[name], rel=TOL, abs=1e-7), name


def test_micro_batches_equal_one_big_batch():
  trees = _trees(2, n=6, size=40)
  batch = tree_layout(trees, rows=4, length=128)
  results = []
  for k in (1, 4):
    learner = Learner(LearnerConfig(micro_batches=k, logits_chunk=32, c_bar=1.5), make_policy())
    results.append(learner.loss_and_grads(batch))
  (l1, g1, m1), (l4, g4, m4) = results
  assert abs(l1 - l4) <= TOL * abs(l1)
  assert rel_diff(g4, g1) < TOL
  assert m4["clip_fraction"] == m1["clip_fraction"]
  assert m4["max_abs_logp_old_minus_rollout"] == pytest.approx(m1["max_abs_logp_old_minus_rollout"], rel=TOL)


def test_sharded_step_equals_single_device_step():
  # One-signed advantages: with mixed signs the loss is a ~270-fold cancellation of terms near 0.2, and
  # its relative difference measures float32 summation order, not the sharding.
  trees = [dataclasses.replace(t, advantage=abs(t.advantage) + 0.5) for t in _trees(3, n=4, size=40)]
  batch = tree_layout(trees, rows=4, length=96)
  cfg = LearnerConfig(optimizer="sgd", lr=0.1, logits_chunk=32, micro_batches=2)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  sharded, single = Learner(cfg, make_policy(), mesh=mesh), Learner(cfg, make_policy())
  emb = sharded.state.params["policy"]["embedding"].value
  assert len(emb.sharding.device_set) == 8 and not emb.sharding.is_fully_replicated
  m_sh, m_1 = sharded.step(batch), single.step(batch)
  assert m_sh["loss"] == pytest.approx(m_1["loss"], rel=TOL)
  assert m_sh["grad_norm"] == pytest.approx(m_1["grad_norm"], rel=TOL)
  assert rel_diff(sharded.state.params, single.state.params) < TOL


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_registered_loss_is_used_and_matches_float64_reference():
  """A loss registered here, picked by name; the learner's value equals a float64 numpy computation from
  full-vocab logits of each path run alone (no gather, no chunking, no compaction)."""
  name = "test_weighted_nll"
  if name not in LOSSES:
    @register_loss(name)
    def weighted_nll(x, cfg):
      return LossTerms(policy=-x.advantages * x.logp, metrics={"nll": -x.logp})

  trees = _trees(4, n=2, size=40)
  batch = paths_layout(trees, length=48)
  cfg = LearnerConfig(loss=name, temperature=0.7, c_bar=1.3, logits_chunk=16)
  policy = make_policy()
  learner = Learner(cfg, policy)
  loss, _, metrics = learner.loss_and_grads(tree_layout(trees, rows=1, length=96))

  logits = np.asarray(policy(batch.tokens_RT, batch.positions_RT, batch.segment_ids_RT, batch.subtree_end_RT),
                      np.float64)
  logp_all = _np_log_softmax(logits / 0.7)
  w = batch.unique_weight_RT.astype(np.float64)
  r, t = np.nonzero(w)
  logp = logp_all[r, t - 1, batch.tokens_RT[r, t]]
  tis = np.minimum(np.exp(logp - batch.rollout_logprobs_RT[r, t]), 1.3)
  ref = np.sum(tis * -batch.advantages_RT[r, t] * logp) / w.sum()
  assert loss == pytest.approx(ref, rel=TOL)
  assert metrics["nll"] == pytest.approx(np.mean(-logp), rel=TOL)
  assert metrics["tis_truncated_fraction"] == pytest.approx(np.mean(
      np.exp(logp - batch.rollout_logprobs_RT[r, t]) > 1.3), abs=1e-6)
  assert 0 < metrics["tis_truncated_fraction"] < 1


def test_unknown_loss_and_missing_critic_are_clear_errors():
  with pytest.raises(ConfigError, match="no_such_loss"):
    Learner(LearnerConfig(loss="no_such_loss"), make_policy())
  with pytest.raises(ValueError, match="value"):
    Learner(LearnerConfig(loss="ppo"), make_policy())


def test_ppo_with_separate_critic_pretrains_then_trains():
  batch = tree_layout(_trees(5, n=2, size=40), rows=2, length=64)
  critic = make_value_model("separate", TINY.d_model, trunk=Decoder(TINY, rngs=nnx.Rngs(7)))
  cfg = LearnerConfig(loss="ppo", logits_chunk=32, value=ValueConfig(kind="separate", pretrain_lr=3e-3))
  learner = Learner(cfg, make_policy(), value=critic)
  policy_before = jax.device_get(learner.state.params["policy"])
  losses = [learner.pretrain_value_step(batch)["value_loss"] for _ in range(5)]
  assert losses[-1] < 0.5 * losses[0]
  assert rel_diff(learner.state.params["policy"], policy_before) == 0.0  # pretraining leaves pi alone
  metrics = learner.step(batch)
  assert np.isfinite(metrics["value_loss"]) and metrics["value_loss"] < losses[0]
  assert int(learner.state.step) == 1


def test_layouts_agree_on_packed_agent_rollouts():
  """The same check on batches from the real tree stage (synthetic harness calls -> filter -> pack)."""
  from clawjax.rl.advantages import grpo_advantages
  from clawjax.tree import synthetic
  from clawjax.tree.filters import filter_rollout
  from clawjax.tree.pack import pack_paths, pack_trees

  rng = np.random.default_rng(6)
  calls, outcomes = synthetic.agent_group(rng, task_id="t", n_rollouts=2, prompt_len=48, n_calls=5,
                                          tokens_per_call=40, vocab_size=TINY.vocab_size,
                                          patterns=("thinking_stripped", "retry", "parallel_tools"))
  trees = [filter_rollout(rid, [c for c in calls if c.rollout_id == rid]).tree for rid in
           dict.fromkeys(c.rollout_id for c in calls)]
  scores = grpo_advantages(outcomes)
  tree, paths = pack_trees(trees, scores, row_len=512), pack_paths(trees, scores, row_len=512)
  assert (paths.segment_ids_RT > 0).sum() > 2 * (tree.segment_ids_RT > 0).sum()
  learner = Learner(LearnerConfig(normalisation="paths", logits_chunk=64), make_policy())
  loss_t, grads_t, _ = learner.loss_and_grads(tree)
  loss_p, grads_p, _ = learner.loss_and_grads(paths)
  # A group of two has advantages +1 and -1, so the loss is a cancellation of terms of both signs; its
  # float32 error is relative to the sum of their magnitudes (the loss of the same batch with |A|, as
  # every ratio is 1 here), not to the small difference that remains.
  magnitude = abs(learner.loss_and_grads(dataclasses.replace(paths, advantages_RT=abs(paths.advantages_RT)))[0])
  assert abs(loss_t - loss_p) <= TOL * magnitude
  assert rel_diff(grads_t, grads_p) < TOL


def _branching_rollout(vocab: int):
  """A rollout whose sampled turn X (echoed whole, thinking kept in history) is continued by two calls
  with different last messages: a retry with a rewritten body, as OpenClaw sends one. Kept with
  `drop_retries=False`, X's tokens lie on two kept paths."""
  from clawjax.calllog import RolloutRecord
  from tests.tree.reference import make_call
  rng = np.random.default_rng(11)
  tokens = lambda n: rng.integers(16, vocab, n).tolist()
  prompt, x, y, z = tokens(20), tokens(12), tokens(10), tokens(9)
  calls = [make_call(0, prompt, x), make_call(1, prompt + x + tokens(6), y),
           make_call(2, prompt + x + tokens(5), z)]
  return calls, [RolloutRecord("r", "t", "h", 1.0, "ok"), RolloutRecord("r2", "t", "h", 0.0, "ok")]


def test_shared_sampled_tokens_tell_unique_from_paths_normalisation():
  """Trained tokens on several kept paths: "unique" counts them once, "paths" once per path, so the two
  normalisations give different losses, and each still agrees between the tree and paths layouts."""
  from clawjax.rl.advantages import grpo_advantages
  from clawjax.tree.filters import FilterConfig, filter_rollout
  from clawjax.tree.pack import pack_paths, pack_trees

  calls, records = _branching_rollout(TINY.vocab_size)
  tree = filter_rollout("r", calls, FilterConfig(drop_retries=False)).tree
  scores = grpo_advantages(records)
  packed_tree, packed_paths = pack_trees([tree], scores, row_len=128), pack_paths([tree], scores, row_len=128)
  assert packed_tree.path_weight_RT.max() == 2  # X is on both kept paths
  losses = {}
  for normalisation in ("unique", "paths"):
    learner = Learner(LearnerConfig(normalisation=normalisation, logits_chunk=32, c_bar=1.5), make_policy())
    loss_t, grads_t, _ = learner.loss_and_grads(packed_tree)
    loss_p, grads_p, _ = learner.loss_and_grads(packed_paths)
    assert abs(loss_t - loss_p) <= TOL * abs(loss_p) and rel_diff(grads_t, grads_p) < TOL
    losses[normalisation] = loss_t
  assert abs(losses["unique"] - losses["paths"]) > 1e-3 * abs(losses["paths"])


def test_a_non_finite_update_is_skipped_and_leaves_the_state_bit_identical():
  trees = _trees(8, n=2, size=40)
  batch = tree_layout(trees, rows=2, length=64)
  learner = Learner(LearnerConfig(logits_chunk=32), make_policy())
  good = learner.step(batch)
  assert good["updates"] == 1 and good["skipped_updates"] == 0
  before = jax.device_get(learner.state)
  broken = dataclasses.replace(batch, advantages_RT=np.where(batch.unique_weight_RT > 0, np.nan, 0.0))
  m = learner.step(broken)
  assert m["skipped_updates"] == 1 and m["updates"] == 0
  after = jax.device_get(learner.state)
  assert int(after.step) == int(before.step) == 1
  for a, b in zip(jax.tree.leaves(before.params) + jax.tree.leaves(before.opt_state),
                  jax.tree.leaves(after.params) + jax.tree.leaves(after.opt_state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert learner.step(batch)["updates"] == 1  # and the next good batch trains again


def test_separate_critic_gradients_do_not_shrink_the_policy_step():
  """With one joint clip a large critic gradient would scale the policy's step down; each group is
  clipped by its own norm, and the critic moves at its own learning rate."""
  batch = tree_layout(_trees(9, n=2, size=40), rows=2, length=64)
  moved = {}
  for coef in (0.5, 5000.0):
    critic = make_value_model("separate", TINY.d_model, trunk=Decoder(TINY, rngs=nnx.Rngs(7)))
    cfg = LearnerConfig(loss="ppo", optimizer="sgd", lr=100.0, grad_clip=1e-3, logits_chunk=32,
                        value=ValueConfig(kind="separate", coef=coef, lr=50.0))
    learner = Learner(cfg, make_policy(), value=critic)
    start = jax.device_get(learner.state.params)
    _, grads, m = learner.loss_and_grads(batch)
    learner.step(batch)
    end = jax.device_get(learner.state.params)
    moved[coef] = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), end, start)
    # SGD steps of -lr * (gradient clipped to norm 1e-3), each group by its own norm; float32 parameters
    # of size ~1 resolve the ~1e-4 steps to ~1e-3 of their size.
    for name, lr, norm in (("policy", 100.0, m["grad_norm"]), ("value", 50.0, m["value_grad_norm"])):
      want = jax.tree.map(lambda g: -lr * min(1.0, 1e-3 / norm) * np.asarray(g, np.float64), grads[name])
      assert rel_diff(moved[coef][name], want) < 2e-2, name
  # A joint clip would have shrunk the policy step ~10^4-fold with the large critic loss.
  assert rel_diff(moved[5000.0]["policy"], moved[0.5]["policy"]) < 2e-2
