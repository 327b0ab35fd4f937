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


BLOCK = 256  # vocabulary entries per block of the two-level inverse CDF (`draw`)


def full_logprobs(logits_BV: jax.Array, temperature_B: jax.Array) -> jax.Array:
  """log softmax(logits / T) over the vocabulary, in float32; T == 0 (greedy) counts as T = 1."""
  t_B = jnp.where(temperature_B > 0, temperature_B, 1.0).astype(jnp.float32)
  return jax.nn.log_softmax(logits_BV.astype(jnp.float32) / t_B[:, None], axis=-1)


def token_logprobs(logits_BV: jax.Array, tokens_B: jax.Array, temperature_B: jax.Array) -> jax.Array:
  """log softmax(logits / T)[token] in float32; T == 0 (greedy) counts as T = 1."""
  return jnp.take_along_axis(full_logprobs(logits_BV, temperature_B), tokens_B[:, None], axis=-1)[:, 0]


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


def draw(probs_BV: jax.Array, u_B: jax.Array) -> jax.Array:
  """Inverse-CDF sampling: per row, the first token at which the cumulative probability reaches
  u * total, for u in (0, 1]. One uniform number a row, where the Gumbel trick draws one per vocabulary
  entry (on CPU that noise cost more than the rest of a 64-row decode step's sampling). Two levels, the
  sums of blocks of BLOCK entries and then the entries of the chosen block, keep each cumulative sum short.
  A token of probability 0 is never drawn: the cumulative sum rises at the token drawn."""
  b, v = probs_BV.shape
  blocks_BNK = jnp.pad(probs_BV, ((0, 0), (0, -v % BLOCK))).reshape(b, -1, BLOCK)
  cdf_BN = jnp.cumsum(blocks_BNK.sum(axis=-1), axis=-1)
  target_B1 = (u_B * cdf_BN[:, -1])[:, None]
  block_B = jnp.minimum(jnp.sum(cdf_BN < target_B1, axis=-1), cdf_BN.shape[1] - 1)
  before_B = jnp.where(block_B > 0, jnp.take_along_axis(cdf_BN, jnp.maximum(block_B - 1, 0)[:, None], 1)[:, 0], 0.0)
  inner_BK = jnp.take_along_axis(blocks_BNK, block_B[:, None, None], axis=1)[:, 0]
  within_B = jnp.sum(before_B[:, None] + jnp.cumsum(inner_BK, axis=-1) < target_B1, axis=-1)
  # Rounding may leave the block's own sum just short of the target: its last token that can be drawn.
  last_B = BLOCK - 1 - jnp.argmax(inner_BK[:, ::-1] > 0, axis=-1)
  return (block_B * BLOCK + jnp.minimum(within_B, last_B)).astype(jnp.int32)


def needs_truncation(params) -> bool:
  """Whether a row with these SamplingParams has its top-k / top-p applied (never a greedy one)."""
  return params.temperature > 0 and (params.top_k > 0 or params.top_p < 1.0)


def sample(logits_BV: jax.Array, keys_B: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array,
           top_p_B: jax.Array, truncate: bool = True) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row; returns (tokens_B int32, logprobs_B float32 per the module convention).

  `keys_B` holds one PRNG key per row (shape [B] of typed keys or [B, 2] uint32), so a row's draw does
  not depend on which other requests share the batch. `truncate` (static): whether to apply the rows'
  top-k / top-p at all; False skips the vocabulary sort (the engine decides per dispatch, rather than
  with a `lax.cond`, which cost XLA's CPU backend more than the whole draw).
  """
  logits_BV = logits_BV.astype(jnp.float32)
  greedy_B = temperature_B <= 0
  logp_BV = full_logprobs(logits_BV, temperature_B)  # (truncation and the draw shift-invariant: logits / T)
  if truncate:
    probs_BV = jax.nn.softmax(truncate_logits(logp_BV, top_k_B, top_p_B), axis=-1)
  else:
    probs_BV = jnp.exp(logp_BV)
  u_B = 1.0 - jax.vmap(jax.random.uniform)(keys_B)
  tokens_B = jnp.where(greedy_B, jnp.argmax(logits_BV, axis=-1), draw(probs_BV, u_B)).astype(jnp.int32)
  return tokens_B, jnp.take_along_axis(logp_BV, tokens_B[:, None], axis=-1)[:, 0]
