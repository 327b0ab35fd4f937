"""Rollout routing replay in the learner: a small Qwen3-MoE (a dense layer, then a MoE layer) trained on a
rollout tree whose calls logged routes. Replaying the routes the model itself would choose changes nothing
(and disagrees nowhere); corrupted routes change the log-probs to exactly what an independent float64
forward that forces those ids gives, in pi_old and in the update's own forward, with remat, on an
expert-sharded mesh and in a separate MoE critic; the router keeps its gradient; tokens without a route
route live; a dense model's step is the same bit for bit."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.calllog import RolloutRecord
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from clawjax.routes import RoutedExperts
from clawjax.tree.build import build_tree
from clawjax.tree.pack import pack_paths

from tests.rl import moe_reference
from tests.tree.reference import make_call

# Layer 0 dense, layer 1 MoE (8 experts, 2 a token): the routes' layer axis is the MoE layers'.
MOE = PRESETS["test-tiny-moe"].replace(vocab_size=256, mlp_only_layers=(0,))
CHUNK = 16


def policy(cfg=MOE, seed=0) -> Decoder:
  return Decoder(cfg, rngs=nnx.Rngs(seed))


def rollout(model: Decoder, with_routes=True):
  """Two calls, the second continuing the first, and a retry of the first's input sampling otherwise:
  routes as the engine would log them (the model's own, from the float64 reference), the second call's
  only past the first's."""
  rng = np.random.default_rng(1)
  prompt, out0, tail, out1, retry = (rng.integers(0, 256, n).tolist() for n in (14, 7, 5, 6, 4))
  calls = [make_call(0, prompt, out0), make_call(1, prompt + out0 + tail, out1), make_call(2, prompt, retry)]
  if not with_routes:
    return calls
  live = lambda seq: np.stack(moe_reference.forward(model, np.asarray(seq))[1], axis=1)[:-1].astype(np.uint8)
  r0 = RoutedExperts(0, live(prompt + out0))
  seq1 = prompt + out0 + tail + out1
  return [dataclasses.replace(calls[0], routed_experts=r0),
          dataclasses.replace(calls[1], routed_experts=RoutedExperts(r0.end, live(seq1)[r0.end:], r0)),
          dataclasses.replace(calls[2], routed_experts=RoutedExperts(0, live(prompt + retry)))]


def batch_of(calls, corrupt=False, unrouted=()):
  """The rollout's paths layout (each row one causal path); routes moved to the next expert with
  `corrupt`, and taken away from the tree tokens at `unrouted`."""
  tree = build_tree("r", calls)
  if tree.routes_TLK is not None:
    routes = (tree.routes_TLK + corrupt) % MOE.n_experts
    routed = tree.routed_T.copy()
    routed[list(unrouted)] = False
    tree = dataclasses.replace(tree, routes_TLK=routes.astype(np.uint8), routed_T=routed)
  scores = grpo_advantages([RolloutRecord("r", "t", "h", 1.0, "ok"), RolloutRecord("s", "t", "h", 0.0, "ok")])
  return pack_paths([tree], scores, row_len=48)


def learner(model, mode="auto", mesh=None, value=None, value_cfg=False, **kw) -> Learner:
  cfg = LearnerConfig(lr=1e-2, logits_chunk=CHUNK, routing_replay=mode,
                      value=ValueConfig(kind="separate") if value_cfg else ValueConfig(), **kw)
  graph, state = nnx.split(model)  # (a learner donates its arrays: each gets copies)
  return Learner(cfg, nnx.merge(graph, jax.tree.map(jnp.copy, state)), mesh=mesh, value=value)


def logp_old(l: Learner, batch):
  return np.asarray(l.old_pass(l.prepare(batch))["logp_old"])


def reference_logp(model, batch, forced: bool) -> np.ndarray:
  """The loss tokens' log-probs from the float64 reference, in the learner's slot order."""
  out = []
  for r in range(batch.shape[0]):
    n = int((batch.segment_ids_RT[r] > 0).sum())
    tokens = batch.tokens_RT[r, :n]
    args = (batch.routes_RTLK[r, :n], batch.routed_RT[r, :n]) if forced else ()
    logp = moe_reference.forward(model, tokens, *args)[0]
    mask = batch.loss_mask_RT()[r, :n]
    out.append(logp[batch.parent_index_RT[r, :n][mask], tokens[mask]])
  return out


def slots(l: Learner, batch, values):
  """The learner's [M, r, K] per-slot values as one array per packed row (its loss tokens, in order)."""
  device = l.prepare(batch)
  weight = np.asarray(device.weight).reshape(-1, device.weight.shape[-1])
  values = np.asarray(values).reshape(weight.shape)
  return [values[r][weight[r] > 0] for r in range(batch.shape[0])]


@pytest.mark.slow
def test_replaying_the_models_own_routes_changes_nothing():
  model = policy()
  batch = batch_of(rollout(model))
  assert batch.routed_RT.any()
  off, replay = learner(model, "off"), learner(model)
  np.testing.assert_allclose(logp_old(replay, batch), logp_old(off, batch), atol=1e-6)
  metrics = replay.step(batch)
  assert metrics["routing/disagree_frac"] == 0.0 and metrics["routing/tokens_any_disagree"] == 0.0
  # Every position a loss token depends on was computed by a call (each path's last token is not one).
  assert metrics["routing/replayed_frac"] == 1.0
  assert "routing/replayed_frac" not in off.step(batch)


def test_corrupted_routes_give_the_log_probs_of_a_forward_forcing_them():
  model = policy()
  calls = rollout(model)
  true, bad = batch_of(calls), batch_of(calls, corrupt=True)
  l = learner(model)
  got = slots(l, bad, logp_old(l, bad))
  for g, want, live in zip(got, reference_logp(model, bad, forced=True), reference_logp(model, true, forced=False)):
    np.testing.assert_allclose(g, want, atol=2e-5)
    assert np.max(np.abs(want - live)) > 1e-2  # the forced experts matter
  metrics = l.step(bad)
  assert metrics["routing/disagree_frac"] == 1.0 and metrics["routing/tokens_any_disagree"] == 1.0


def test_tokens_without_a_route_route_live_and_are_counted():
  model = policy()
  bad = batch_of(rollout(model), corrupt=True, unrouted=range(0, 30, 3))
  l = learner(model)
  for g, want in zip(slots(l, bad, logp_old(l, bad)), reference_logp(model, bad, forced=True)):
    np.testing.assert_allclose(g, want, atol=2e-5)
  counted = (bad.segment_ids_RT > 0) & (bad.subtree_end_RT > np.arange(1, bad.shape[1] + 1))
  expected = (counted & bad.routed_RT).sum() / counted.sum()
  assert 0 < expected < 1 and l.step(bad)["routing/replayed_frac"] == pytest.approx(expected)


def _router_grad(grads) -> float:
  leaves = jax.tree_util.tree_flatten_with_path(grads["policy"])[0]
  return sum(float(np.abs(np.asarray(g)).sum()) for p, g in leaves if "router" in jax.tree_util.keystr(p))


def test_the_router_keeps_its_gradient_and_the_update_forward_replays_too():
  model = policy()
  bad = batch_of(rollout(model), corrupt=True)
  l = learner(model)
  _, grads, metrics = l.loss_and_grads(bad)
  assert _router_grad(grads) > 0
  # pi_old and the update's forward force the same ids: the first update's ratio is exactly 1.
  assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-7) and metrics["clip_fraction"] == 0.0


def test_remat_scan_and_an_expert_sharded_mesh_replay_the_same_ids():
  model = policy()
  bad = batch_of(rollout(model), corrupt=True)
  want = logp_old(learner(model), bad)
  remat = policy(MOE.replace(remat=True))
  np.testing.assert_allclose(logp_old(learner(remat), bad), want, atol=1e-5)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, expert=4), jax.devices()[:8])
  np.testing.assert_allclose(logp_old(learner(model, mesh=mesh), bad), want, atol=1e-5)


def test_a_separate_moe_critic_replays_the_policys_ids():
  # A critic trunk with the policy's weights: the policy's routes are its own live ones.
  model = policy()
  calls = rollout(model)
  true, bad = batch_of(calls), batch_of(calls, corrupt=True)


  def critic():
    c = make_value_model("separate", MOE.d_model, policy())
    c.head.kernel.value = jnp.asarray(np.random.default_rng(0).normal(size=MOE.d_model), jnp.float32)  # (V != 0)
    return c

  values = lambda mode, batch: np.asarray(learner(model, mode, value=critic(), value_cfg=True)
                                          .old_pass(batch)["values_old"])
  live = values("off", true)
  np.testing.assert_allclose(values("auto", true), live, atol=1e-6)
  assert np.max(np.abs(values("auto", bad) - live)) > 1e-4


def test_a_dense_models_step_is_unchanged_bit_for_bit():
  dense = PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=256)
  model = policy(dense)
  plain = batch_of(rollout(model, with_routes=False))
  with_routes = dataclasses.replace(plain, routes_RTLK=np.ones((*plain.shape, 1, 2), np.uint8),
                                    routed_RT=plain.segment_ids_RT > 0)
  a, b = learner(model), learner(model)
  ma, mb = a.step(plain), b.step(with_routes)
  timing = ("step_seconds", "tokens_per_s")
  assert ma.keys() == mb.keys() and all(ma[k] == mb[k] for k in ma if k not in timing)
  for x, y in zip(jax.tree.leaves(a.state.params), jax.tree.leaves(b.state.params)):
    assert np.array_equal(np.asarray(x), np.asarray(y))


def test_rollout_mode_needs_routes_and_a_moe_model():
  with pytest.raises(ValueError, match="needs a MoE policy"):
    learner(policy(PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=256)), "rollout")
  model = policy()
  with pytest.raises(ValueError, match="routing_replay='rollout': the step's calls carry no routed experts"):
    learner(model, "rollout").prepare(batch_of(rollout(model, with_routes=False)))
  with pytest.raises(ValueError, match="routing_replay"):
    LearnerConfig(routing_replay="always")
