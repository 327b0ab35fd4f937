"""Per-token RL losses, their registry, and the truncated importance weight every policy loss gets.

A loss sees one micro-batch of loss tokens as `TokenInputs` (arrays [rows, K], K = the row's loss-token
slots) and returns per-token terms; the train step multiplies the policy term by the TIS weight, adds the
extra term, and normalises by the global weight sum (clawjax.rl.learner). Adding a loss:

  @register_loss("my_loss")
  def my_loss(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
    ratio = jnp.exp(x.logp - x.logp_old)
    return LossTerms(policy=-ratio * x.advantages)

then `LearnerConfig(loss="my_loss")`. A loss that reads an optional input (`values`, `logp_ref`) says so
with `needs=`, and a config that leaves the input off is rejected when it is parsed. From outside the
package: put the function in a module and name it in `--config.plugins=my_pkg.my_losses`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from clawjax.config import ConfigError
from clawjax.rl.config import LearnerConfig


@dataclasses.dataclass(frozen=True)
class TokenInputs:
  """Everything a loss may use, per loss token. Only `logp` and `values` carry gradients."""
  logp: jax.Array               # log pi_theta(a_t | s_t) at the learner temperature
  logp_old: jax.Array           # log pi_old: the same params before the update, recomputed by the learner
  logp_rollout: jax.Array       # the engine's log-prob from the call log
  advantages: jax.Array         # from the batch (GRPO: the rollout's group-normalised A)
  returns: jax.Array            # the rollout's reward R on its tokens
  mask: jax.Array               # bool: a trained token (padding slots are False)
  entropy: jax.Array            # entropy of pi_theta(. | s_t), no gradient (a metric; losses may use it)
  values: jax.Array | None = None      # V_phi(s_t) when the config has a value model
  values_old: jax.Array | None = None  # V before the update (PPO advantage and value clipping)
  logp_ref: jax.Array | None = None    # log pi_ref when kl_coef > 0
  rng: jax.Array | None = None         # this step's PRNG key (from the checkpointed train state)


@dataclasses.dataclass(frozen=True)
class LossTerms:
  """Per-token terms, each [rows, K]. The step forms  w_t * policy + extra  and normalises it; every
  entry of `metrics` is reported as its weighted mean over loss tokens."""
  policy: jax.Array
  extra: jax.Array | float = 0.0
  metrics: dict[str, jax.Array] = dataclasses.field(default_factory=dict)


# The optional TokenInputs a loss may need, and the LearnerConfig field (and test) that turns each on.
OPTIONAL_INPUTS: dict[str, tuple[str, Callable[[LearnerConfig], bool], str]] = {
    "values": ("value.kind", lambda cfg: cfg.value.kind != "none", "set it to 'shared' or 'separate'"),
    "values_old": ("value.kind", lambda cfg: cfg.value.kind != "none", "set it to 'shared' or 'separate'"),
    "logp_ref": ("kl_coef", lambda cfg: cfg.kl_coef > 0, "set it > 0 (log pi_ref is computed only then)"),
}


@dataclasses.dataclass(frozen=True)
class LossSpec:
  fn: Callable[[TokenInputs, LearnerConfig], LossTerms]
  needs: frozenset[str] = frozenset()  # optional TokenInputs the loss reads (OPTIONAL_INPUTS)


LOSSES: dict[str, LossSpec] = {}


def register_loss(name: str, *, needs: Sequence[str] = ()):
  """Decorator: make `fn(inputs, config) -> LossTerms` available as LearnerConfig(loss=name)."""
  unknown = sorted(set(needs) - set(OPTIONAL_INPUTS))
  if unknown:
    raise ValueError(f"register_loss({name!r}): needs={unknown} are not optional inputs {sorted(OPTIONAL_INPUTS)}")

  def wrap(fn):
    if name in LOSSES:
      raise ValueError(f"loss {name!r} is already registered")
    LOSSES[name] = LossSpec(fn, frozenset(needs))
    return fn

  return wrap


def check_loss(cfg: LearnerConfig, where: str = "config.learner") -> LossSpec:
  """The registered loss of `cfg`; a ConfigError naming the field when it is unknown or when an input it
  needs is off."""
  if cfg.loss not in LOSSES:
    close = difflib.get_close_matches(cfg.loss, list(LOSSES), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"{where}.loss: {cfg.loss!r} is not a registered loss {sorted(LOSSES)}{hint} "
                      "(a loss of your own: --config.plugins=MODULE)")
  spec = LOSSES[cfg.loss]
  for name in sorted(spec.needs):
    field, enabled, how = OPTIONAL_INPUTS[name]
    if not enabled(cfg):
      raise ConfigError(f"{where}.{field}: loss {cfg.loss!r} reads {name}, which is off; {how}")
  return spec


def tis_weights(logp_old: jax.Array, logp_rollout: jax.Array, c_bar: float) -> tuple[jax.Array, jax.Array]:
  """Eq. 4: w_t = min(pi_old / pi_rollout, c_bar), gradient stopped; also whether it was truncated."""
  raw = jnp.exp(jax.lax.stop_gradient(logp_old) - logp_rollout)
  return jnp.minimum(raw, c_bar), raw > c_bar


def clipped_surrogate(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array,
                      eps_low: float, eps_high: float, max_log_ratio: float = 20.0
                      ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) with r = pi_theta / pi_old (its log clamped to
  +-max_log_ratio, so that r stays finite), and its metrics."""
  log_ratio = jnp.clip(logp - logp_old, -max_log_ratio, max_log_ratio)
  ratio = jnp.exp(log_ratio)
  unclipped = ratio * advantages
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
  loss = -jnp.minimum(unclipped, clipped)
  lr = jax.lax.stop_gradient(log_ratio)
  metrics = {
      "clip_fraction": (clipped < unclipped).astype(jnp.float32),
      # k3 estimator of KL(pi_old || pi_theta) on pi_old samples (Schulman, "Approximating KL").
      "approx_kl": jnp.expm1(lr) - lr,
  }
  return loss, metrics


def k3_kl(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
  """k3 = exp(d) - d - 1, d = log pi_ref - log pi_theta (Schulman, "Approximating KL").

  Its value is an unbiased, non-negative estimate of KL(pi_theta || pi_ref) on pi_theta samples, as
  GRPO (DeepSeekMath) uses it; but as a loss its expected gradient, E_theta[(1 - pi_ref/pi_theta) grad
  log pi_theta], is the gradient of KL(pi_ref || pi_theta), the reverse KL."""
  d = logp_ref - logp
  return jnp.expm1(d) - d


def k2_kl(logp: jax.Array, logp_ref: jax.Array) -> jax.Array:
  """k2 = (log pi_theta - log pi_ref)^2 / 2: as a loss its expected gradient on pi_theta samples,
  E_theta[(log pi_theta - log pi_ref) grad log pi_theta], is exactly the gradient of KL(pi_theta || pi_ref)."""
  return 0.5 * jnp.square(logp - logp_ref)


KL_PENALTIES = {"k3": k3_kl, "k2": k2_kl}


def _policy_term(x: TokenInputs, cfg: LearnerConfig, advantages: jax.Array) -> tuple[jax.Array, dict]:
  """The clipped surrogate, plus kl_coef times the KL penalty. Both are scaled by the TIS weight in the
  step: the penalty's samples come from pi_rollout too, and w corrects them toward pi_old."""
  loss, metrics = clipped_surrogate(x.logp, x.logp_old, advantages, cfg.eps_low, cfg.eps_high, cfg.max_log_ratio)
  metrics["policy_loss"] = loss
  if cfg.kl_coef:
    kl = KL_PENALTIES[cfg.kl_estimator](x.logp, x.logp_ref)
    metrics["kl_ref"] = kl
    loss = loss + cfg.kl_coef * kl
  return loss, metrics


@register_loss("grpo")
def grpo(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
  """Eq. 1: token-level clipped surrogate with the batch's (group-normalised) advantages."""
  loss, metrics = _policy_term(x, cfg, x.advantages)
  return LossTerms(policy=loss, metrics=metrics)


def value_loss(values: jax.Array, values_old: jax.Array, returns: jax.Array, clip: float | None) -> jax.Array:
  """0.5 (V - R)^2, or with clip the PPO2 pessimistic max over V and V_old + clip(V - V_old)."""
  err = jnp.square(values - returns)
  if clip is None:
    return 0.5 * err
  v_clipped = values_old + jnp.clip(values - values_old, -clip, clip)
  return 0.5 * jnp.maximum(err, jnp.square(v_clipped - returns))


@register_loss("ppo", needs=("values", "values_old"))
def ppo(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
  """Eq. 2 with branch-local GAE at gamma = lambda = 1: A_t = R - V_old(s_t), plus the value loss."""
  advantages = x.returns - x.values_old
  loss, metrics = _policy_term(x, cfg, advantages)
  v_loss = value_loss(x.values, x.values_old, x.returns, cfg.value.clip)
  metrics["value_loss"] = v_loss
  metrics["ppo_advantage"] = advantages
  return LossTerms(policy=loss, extra=cfg.value.coef * v_loss, metrics=metrics)


@register_loss("sft")
def sft(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
  """Cross-entropy on demonstrated tokens (cold start). It goes in `extra`, which the TIS weight does not
  scale: a demonstration has no sampling distribution to correct for."""
  del cfg
  return LossTerms(policy=jnp.zeros_like(x.logp), extra=-x.logp, metrics={"nll": -x.logp})
