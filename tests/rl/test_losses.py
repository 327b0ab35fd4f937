"""Per-token losses and the TIS weight against float64 numpy references (values and gradients)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.config import ConfigError
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.losses import (LOSSES, LossTerms, TokenInputs, check_loss, clipped_surrogate, k2_kl, k3_kl,
                               register_loss, rollout_mean, rollout_sum, tis_weights, value_loss)


def _inputs(seed: int = 0, n: int = 400):
  rng = np.random.default_rng(seed)
  logp_old = -rng.random(n) * 5
  logp = logp_old + rng.normal(0, 0.4, n)        # ratios well inside and outside the clip range
  return dict(logp=logp, logp_old=logp_old, logp_rollout=logp_old + rng.normal(0, 1.0, n),
              advantages=rng.normal(size=n), returns=rng.random(n), values=rng.normal(0.5, 0.3, n),
              values_old=rng.normal(0.5, 0.3, n), logp_ref=logp_old + rng.normal(0, 0.2, n))


def _token_inputs(d: dict) -> TokenInputs:
  f32 = {k: jnp.asarray(v, jnp.float32) for k, v in d.items()}
  return TokenInputs(mask=jnp.ones_like(f32["logp"], bool), entropy=jnp.zeros_like(f32["logp"]), **f32)


def test_tis_weights_match_float64_and_stop_gradient():
  d = _inputs()
  w, truncated = tis_weights(jnp.float32(d["logp_old"]), jnp.float32(d["logp_rollout"]), 2.0)
  ref = np.minimum(np.exp(d["logp_old"] - d["logp_rollout"]), 2.0)
  np.testing.assert_allclose(np.asarray(w), ref, rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(truncated), np.exp(d["logp_old"] - d["logp_rollout"]) > 2.0)
  assert 0.05 < np.mean(np.asarray(truncated)) < 0.95
  grad = jax.grad(lambda lo: tis_weights(lo, jnp.float32(d["logp_rollout"]), 2.0)[0].sum())(jnp.float32(d["logp_old"]))
  assert not np.any(np.asarray(grad))


def _np_surrogate(d, eps_low, eps_high, adv):
  """Loss, d loss / d logp and clipped indicator of -min(rA, clip(r)A), written out case by case."""
  r = np.exp(d["logp"] - d["logp_old"])
  clipped_r = np.clip(r, 1 - eps_low, 1 + eps_high)
  use_clipped = clipped_r * adv < r * adv
  loss = -np.where(use_clipped, clipped_r * adv, r * adv)
  grad = np.where(use_clipped, 0.0, -r * adv)  # the clipped branch is constant in logp
  return loss, grad, use_clipped


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_grpo_matches_numpy(kl_coef):
  d = _inputs(1)
  cfg = LearnerConfig(eps_low=0.2, eps_high=0.28, kl_coef=kl_coef)
  loss_ref, grad_ref, clip_ref = _np_surrogate(d, 0.2, 0.28, d["advantages"])
  delta = d["logp_ref"] - d["logp"]
  loss_ref = loss_ref + kl_coef * (np.exp(delta) - delta - 1)
  grad_ref = grad_ref + kl_coef * (1 - np.exp(delta))

  def f(logp):
    x = _token_inputs({**d, "logp": logp})
    return LOSSES["grpo"].fn(x, cfg)

  terms = f(jnp.float32(d["logp"]))
  np.testing.assert_allclose(np.asarray(terms.policy), loss_ref, rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(terms.metrics["clip_fraction"]) > 0, clip_ref)
  assert 0.05 < clip_ref.mean() < 0.95
  grad = jax.grad(lambda lp: f(lp).policy.sum())(jnp.float32(d["logp"]))
  np.testing.assert_allclose(np.asarray(grad), grad_ref, rtol=1e-4, atol=1e-6)
  lr = d["logp"] - d["logp_old"]
  np.testing.assert_allclose(np.asarray(terms.metrics["approx_kl"]), np.exp(lr) - 1 - lr, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("clip", [None, 0.1])
def test_ppo_matches_numpy(clip):
  d = _inputs(2)
  cfg = LearnerConfig(value=ValueConfig(kind="shared", coef=0.7, clip=clip))
  adv = d["returns"] - d["values_old"]
  loss_ref, _, _ = _np_surrogate(d, 0.2, 0.28, adv)
  err = (d["values"] - d["returns"]) ** 2
  if clip is not None:
    v_c = d["values_old"] + np.clip(d["values"] - d["values_old"], -clip, clip)
    err = np.maximum(err, (v_c - d["returns"]) ** 2)
  terms = LOSSES["ppo"].fn(_token_inputs(d), cfg)
  np.testing.assert_allclose(np.asarray(terms.policy), loss_ref, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(terms.extra), 0.7 * 0.5 * err, rtol=1e-4, atol=1e-6)
  assert {"values", "values_old"} <= LOSSES["ppo"].needs and not LOSSES["grpo"].needs


def test_value_loss_gradient_is_zero_where_clipped():
  v_old, ret = jnp.float32([0.0, 0.0]), jnp.float32([1.0, 1.0])
  g = jax.grad(lambda v: value_loss(v, v_old, ret, 0.2).sum())(jnp.float32([0.5, 0.1]))
  # 0.5 is beyond the clip: the pessimistic max picks the constant clipped branch (error 0.8 > 0.5).
  np.testing.assert_allclose(np.asarray(g), [0.0, 0.1 - 1.0], rtol=1e-6)


def test_k3_kl_is_nonnegative_and_zero_at_equality():
  a = jnp.float32(np.random.default_rng(3).normal(size=100))
  assert float(jnp.min(k3_kl(a, a + 0.5))) > 0
  np.testing.assert_array_equal(np.asarray(k3_kl(a, a)), 0.0)


def test_registry_rejects_duplicates_and_names_unknown():
  with pytest.raises(ValueError, match="already registered"):
    register_loss("grpo")(lambda x, cfg: LossTerms(policy=x.logp))
  with pytest.raises(ConfigError, match=r"config\.learner\.loss: 'grpoo' .*did you mean grpo"):
    check_loss(LearnerConfig(loss="grpoo"))
  with pytest.raises(ConfigError, match=r"config\.learner\.value\.kind: loss 'ppo' reads values"):
    check_loss(LearnerConfig(loss="ppo"))
  with pytest.raises(ValueError, match="not optional inputs"):
    register_loss("needs_nothing_known", needs=("advantage",))


def test_clamped_log_ratio_keeps_the_surrogate_finite():
  logp, logp_old, adv = jnp.float32([0.0, 0.0]), jnp.float32([-100.0, 100.0]), jnp.float32([-1.0, 1.0])
  loss, _ = clipped_surrogate(logp, logp_old, adv, 0.2, 0.28, max_log_ratio=20.0)
  g = jax.grad(lambda lp: clipped_surrogate(lp, logp_old, adv, 0.2, 0.28, 20.0)[0].sum())(logp)
  assert np.isfinite(np.asarray(loss)).all() and np.isfinite(np.asarray(g)).all()
  np.testing.assert_allclose(np.asarray(loss)[0], np.exp(20.0), rtol=1e-5)  # ratio capped at e^20


def test_kl_penalties_have_the_gradients_their_docstrings_name():
  """Exact expectations over a 5-way softmax: E_theta[grad k3] = grad KL(ref || theta) and
  E_theta[grad k2] = grad KL(theta || ref) (the sampling distribution held fixed, as in a loss)."""
  rng = np.random.default_rng(0)
  z, ref = jnp.asarray(rng.normal(size=5)), jax.nn.log_softmax(jnp.asarray(rng.normal(size=5)))

  def expected(penalty, z):
    logp = jax.nn.log_softmax(z)
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * penalty(logp, ref))

  kl = lambda p_log, q_log: jnp.sum(jnp.exp(p_log) * (p_log - q_log))
  grad_reverse = jax.grad(lambda z: kl(ref, jax.nn.log_softmax(z)))(z)
  grad_forward = jax.grad(lambda z: kl(jax.nn.log_softmax(z), ref))(z)
  np.testing.assert_allclose(jax.grad(lambda z: expected(k3_kl, z))(z), grad_reverse, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(jax.grad(lambda z: expected(k2_kl, z))(z), grad_forward, rtol=1e-5, atol=1e-7)
  assert not np.allclose(grad_reverse, grad_forward, rtol=1e-2)  # the two really differ here


def test_rollout_reductions_are_segment_sums_inside_each_row():
  """rollout_sum / rollout_mean against a loop over (row, rollout) in float64: several rollouts a row,
  in any order of slots, padding slots (rollout -1) left at 0, both weightings, under jit."""
  rng = np.random.default_rng(4)
  rows, k = 3, 16
  rollout = rng.integers(0, 4, (rows, k)).astype(np.int32)
  rollout[:, -3:] = -1
  unique = (rng.random((rows, k)) < 0.8).astype(np.float32) * (rollout >= 0)
  paths = unique * rng.integers(1, 4, (rows, k))
  values = rng.normal(size=(rows, k))
  zeros = jnp.zeros((rows, k))
  x = TokenInputs(logp=zeros, logp_old=zeros, logp_rollout=zeros, advantages=zeros, returns=zeros,
                  mask=jnp.asarray(unique > 0), entropy=zeros, rollout=jnp.asarray(rollout),
                  unique_weight=jnp.asarray(unique), path_weight=jnp.asarray(paths))
  for weight, w in (("unique", unique), ("paths", paths)):
    got_sum = np.asarray(jax.jit(lambda v: rollout_sum(v, x, weight))(jnp.float32(values)))
    got_mean = np.asarray(jax.jit(lambda v: rollout_mean(v, x, weight))(jnp.float32(values)))
    for r in range(rows):
      for t in range(k):
        if rollout[r, t] < 0:
          assert got_sum[r, t] == got_mean[r, t] == 0
          continue
        same = rollout[r] == rollout[r, t]
        total = np.sum(w[r, same] * values[r, same])
        np.testing.assert_allclose(got_sum[r, t], total, rtol=1e-5, atol=1e-6)
        mean = total / w[r, same].sum() if w[r, same].any() else 0.0  # a rollout without weight: 0
        np.testing.assert_allclose(got_mean[r, t], mean, rtol=1e-5, atol=1e-6)
