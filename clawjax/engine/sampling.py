"""Token sampling with explicit PRNG keys, one set of sampling parameters per batch row.

Log-prob convention (shared with the learner, see `token_logprobs`): the log-prob reported for a sampled
token is log softmax(logits / T) over the FULL vocabulary at the row's temperature T, before any top-k /
top-p truncation. Truncation only restricts which tokens can be drawn. Greedy rows (T == 0) report
log softmax(logits), i.e. T = 1. The learner recomputes exactly this from a plain forward pass, so the
importance ratio pi_old / pi_rollout is 1 up to float error when the weights are the same.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array, temperature_B: jax.Array) -> jax.Array:
  """log softmax(logits / T)[token] in float32; T == 0 (greedy) counts as T = 1."""
  t_B = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
  logp_BV = jax.nn.log_softmax(logits_BV.astype(jnp.float32) / t_B[:, None], axis=-1)
  return jnp.take_along_axis(logp_BV, tokens_B[:, None], axis=-1)[:, 0]


def truncate_logits(scaled_BV: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array) -> jax.Array:
  """Sets to -inf every logit outside the row's top-k and outside its top-p nucleus.

  top_k <= 0 and top_p >= 1 disable the filters. The nucleus is the smallest set of most likely tokens
  whose probability (after top-k) reaches top_p; ties at the boundary keep every tied token.
  """
  vocab = scaled_BV.shape[-1]
  sorted_BV = jnp.sort(scaled_BV, axis=-1)[:, ::-1]
  k_B = jnp.where(top_k_B > 0, jnp.minimum(top_k_B, vocab), vocab)
  kth_B = jnp.take_along_axis(sorted_BV, (k_B - 1)[:, None], axis=-1)
  sorted_BV = jnp.where(jnp.arange(vocab)[None, :] < k_B[:, None], sorted_BV, -jnp.inf)
  probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
  mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
  # Position 0 is always kept, so a row never loses every token.
  keep_BV = (mass_before_BV < top_p_B[:, None]) | (jnp.arange(vocab)[None, :] == 0)
  n_keep_B = jnp.sum(keep_BV & (sorted_BV > -jnp.inf), axis=-1)
  pth_B = jnp.take_along_axis(sorted_BV, (jnp.maximum(n_keep_B, 1) - 1)[:, None], axis=-1)
  threshold_B1 = jnp.maximum(kth_B, pth_B)
  return jnp.where(scaled_BV >= threshold_B1, scaled_BV, -jnp.inf)


def sample(logits_BV: jax.Array, keys_B: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array,
           top_p_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row; returns (tokens_B int32, logprobs_B float32 per the module convention).

  `keys_B` holds one PRNG key per row (shape [B] of typed keys or [B, 2] uint32), so a row's draw does
  not depend on which other requests share the batch.
  """
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_B = temperature_B <= 0
  scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, temperature_B)[:, None]
  needs_truncation = jnp.any(((top_k_B > 0) | (top_p_B < 1.0)) & ~greedy_B)
  truncated_BV = jax.lax.cond(needs_truncation, truncate_logits, lambda s, k, p: s,
                              scaled_BV, top_k_B, top_p_B)
  drawn_B = jax.vmap(jax.random.categorical)(keys_B, truncated_BV)
  tokens_B = jnp.where(greedy_B, jnp.argmax(logits_BV, axis=-1), drawn_B).astype(jnp.int32)
  return tokens_B, token_logprobs(logits_BV, tokens_B, temperature_B)
