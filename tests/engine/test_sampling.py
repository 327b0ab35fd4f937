"""Sampling against a float64 numpy reference of the temperature / top-k / top-p distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.engine import sampling


def reference_distribution(logits_V: np.ndarray, temperature: float, top_k: int, top_p: float):
  """Brute force: the distribution sampling should draw from, in float64."""
  scaled = logits_V.astype(np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")
  allowed = np.zeros(len(scaled), bool)
  k = len(scaled) if top_k <= 0 else top_k
  top = order[:k]
  p = np.exp(scaled[top] - scaled[top].max())
  p /= p.sum()
  mass = 0.0
  for tok, pr in zip(top, p):
    allowed[tok] = True
    mass += pr
    if mass >= top_p:
      break
  probs = np.where(allowed, np.exp(scaled - scaled.max()), 0.0)
  return probs / probs.sum()


def full_logprobs(logits_V: np.ndarray, temperature: float) -> np.ndarray:
  s = logits_V.astype(np.float64) / (temperature if temperature > 0 else 1.0)
  return s - s.max() - np.log(np.exp(s - s.max()).sum())


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.6),
                                                     (0.9, 4, 0.8)])
def test_sample_frequencies_match_reference(temperature, top_k, top_p):
  rng = np.random.default_rng(0)
  logits_V = rng.normal(size=8).astype(np.float32) * 1.5
  n = 20000
  keys = jax.random.split(jax.random.key(1), n)
  logits_BV = jnp.broadcast_to(jnp.asarray(logits_V), (n, 8))
  tokens, logprobs = jax.jit(sampling.sample)(
      logits_BV, keys, jnp.full(n, temperature), jnp.full(n, top_k, jnp.int32), jnp.full(n, top_p))
  tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)
  want = reference_distribution(logits_V, temperature, top_k, top_p)
  freq = np.bincount(tokens, minlength=8) / n
  assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(want))
  np.testing.assert_allclose(freq, want, atol=0.015)
  # The reported log-prob is the untruncated one at temperature T, whatever the filters did.
  np.testing.assert_allclose(logprobs, full_logprobs(logits_V, temperature)[tokens], atol=1e-5)


def test_greedy_rows_and_sampled_rows_share_a_batch():
  rng = np.random.default_rng(1)
  logits_BV = rng.normal(size=(4, 50)).astype(np.float32)
  temps = np.array([0.0, 1.0, 0.0, 0.5], np.float32)
  tokens, logprobs = sampling.sample(jnp.asarray(logits_BV), jax.random.split(jax.random.key(0), 4),
                                     jnp.asarray(temps), jnp.array([0, 5, 3, 0]),
                                     jnp.array([1.0, 0.9, 0.1, 1.0]))
  tokens = np.asarray(tokens)
  for row in (0, 2):
    assert tokens[row] == np.argmax(logits_BV[row])
  for row in range(4):
    want = full_logprobs(logits_BV[row], temps[row])[tokens[row]]
    assert abs(float(logprobs[row]) - want) < 1e-5


def test_row_draw_depends_only_on_its_key():
  rng = np.random.default_rng(2)
  logits_BV = jnp.asarray(rng.normal(size=(3, 100)).astype(np.float32))
  keys = jax.random.split(jax.random.key(7), 3)
  args = (jnp.ones(3), jnp.zeros(3, jnp.int32), jnp.ones(3))
  together, _ = sampling.sample(logits_BV, keys, *args)
  alone, _ = sampling.sample(logits_BV[1:2], keys[1:2], *(a[1:2] for a in args))
  assert int(together[1]) == int(alone[0])


def test_inverse_cdf_draw_against_float64():
  """`draw` over 600 tokens (three blocks, the last one partial) with a third of them at probability 0:
  the float64 inverse CDF's token wherever u is not within float32 rounding of a boundary, and never a
  token of probability 0, u = 1 included."""
  rng = np.random.default_rng(3)
  probs = rng.random(600) * (rng.random(600) > 0.33)
  probs[-40:] = 0.0  # the distribution ends before the vocabulary does
  probs /= probs.sum()
  u = np.concatenate([np.linspace(1e-7, 1.0, 20000), [1.0]])
  got = np.asarray(sampling.draw(jnp.asarray(np.broadcast_to(probs, (len(u), 600)), jnp.float32),
                                 jnp.asarray(u, jnp.float32)))
  cdf = np.cumsum(probs)
  want = np.searchsorted(cdf, u * cdf[-1], side="left")
  near_boundary = np.min(np.abs(u[:, None] - cdf[None, probs > 0]), axis=1) < 1e-5
  assert np.all(probs[got] > 0)
  assert np.all((got == want) | near_boundary) and np.mean(got == want) > 0.99
