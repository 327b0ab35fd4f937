"""RL losses, their registry, the rollout-level helpers a loss may call, and the truncated importance weight.

What a loss sees and returns. A loss is called inside the jitted step on one micro-batch of loss tokens,
`TokenInputs` (arrays [rows, K], K = the row's loss-token slots, padding slots have mask False), and
returns per-token terms, `LossTerms`. Around it the step does two things a loss author must know:
  1. the TIS weight: the token's loss is  w_t * policy_t + extra_t,  w_t = min(pi_old / pi_rollout,
     c_bar) with its gradient stopped (Eq. 4: the tokens were sampled by the engine's pi_rollout, and w_t
     corrects them toward pi_old). `extra` (a value loss, a cross-entropy) is not weighted. A loss that
     weighs its samples its own way (a sequence-level weight, say) sets LossTerms(owns_tis=True): the step
     then adds `policy` unweighted; `x.tis` is w_t for reading.
  2. the aggregation (LearnerConfig.aggregation): the batch's loss is  sum_t a_t loss_t / N  over every
     loss token of the (mini)batch, a_t and N from clawjax.rl.device_batch.aggregation_weights: "token"
     (a_t = 1, N = tokens), "paths" (a_t = kept paths through t, N = their sum), "rollout" (a_t = 1 / the
     tokens of t's rollout, N = rollouts: each rollout's mean, then the mean over rollouts), "constant"
     (a_t = 1 / aggregation_tokens, N = rollouts). A sequence-level loss names the aggregation it is
     defined with, register_loss(aggregation="rollout"): the step applies it unless the config names
     another (to compare aggregations of one loss). Every metric is its a-weighted mean over loss tokens.

Rollouts: the packer keeps each rollout's tree in one row (clawjax.tree.pack, also with share_prompts and
several rollouts a row), so `rollout_mean` / `rollout_sum` reduce over one rollout's tokens inside a
row, within the micro-batch, on one device. A loss that calls them is registered with sequence=True, and
a batch whose rollout spans rows (the paths layout can split one) is refused for it.

Adding a loss (a tutorial: docs/learner.md, "Write your own loss"):

  @dataclasses.dataclass(frozen=True)
  class MyOptions:
    beta: float = 0.01  # the entropy bonus

  @register_loss("my_loss", options=MyOptions, entropy_grad=True)
  def my_loss(x: TokenInputs, cfg: LearnerConfig, opt: MyOptions) -> LossTerms:
    ratio = jnp.exp(x.logp - x.logp_old)
    return LossTerms(policy=-ratio * x.advantages - opt.beta * x.entropy)

then `LearnerConfig(loss="my_loss", loss_kwargs={"beta": 0.02})`. A loss that declares no options takes
(x, cfg) and refuses any loss_kwargs. A loss that reads an optional input (`values`, `logp_ref`) says so
with `needs=`, and a config that leaves the input off is rejected when it is parsed. From outside the
package: put the function in a module and name it in `--config.plugins=my_pkg.my_losses`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from clawjax import config as config_lib
from clawjax.config import ConfigError
from clawjax.rl.config import AGGREGATIONS, LearnerConfig


@dataclasses.dataclass(frozen=True)
class TokenInputs:
  """Everything a loss may use, per loss token. Only `logp` and `values` carry gradients (and `entropy`
  for a loss registered with entropy_grad=True)."""
  logp: jax.Array               # log pi_theta(a_t | s_t) at the learner temperature
  logp_old: jax.Array           # log pi_old: the same params before the update, recomputed by the learner
  logp_rollout: jax.Array       # the engine's log-prob from the call log
  advantages: jax.Array         # from the batch (GRPO: the rollout's group-normalised A)
  returns: jax.Array            # the rollout's reward R on its tokens
  mask: jax.Array               # bool: a trained token (padding slots are False)
  # Entropy of pi_theta(. | s_t). A constant (its gradient stopped: the backward through the vocabulary
  # costs ~25% more with it) unless the loss is registered with entropy_grad=True, as an entropy bonus
  # must be: written without it, the bonus compiles, runs and moves nothing.
  entropy: jax.Array
  values: jax.Array | None = None      # V_phi(s_t) when the config has a value model
  values_old: jax.Array | None = None  # V before the update (PPO advantage and value clipping)
  logp_ref: jax.Array | None = None    # log pi_ref when kl_coef > 0
  rng: jax.Array | None = None         # this step's PRNG key (from the checkpointed train state)
  tis: jax.Array | None = None         # w_t = min(pi_old / pi_rollout, c_bar), gradient stopped
  baselines: jax.Array | None = None   # the mean reward of the rollout's GRPO group (A without std: R - b)
  # The rollout structure (the learner fills it; `rollout_mean` reads it). Within one row:
  rollout: jax.Array | None = None        # int32: the index of the token's rollout in its row; -1 on padding
  unique_weight: jax.Array | None = None  # 1 on a trained token (once however many kept paths hold it)
  path_weight: jax.Array | None = None    # the number of kept root-to-leaf paths through the token


@dataclasses.dataclass(frozen=True)
class LossTerms:
  """Per-token terms, each [rows, K]. The step forms  w_t * policy + extra  (w_t: the TIS weight; with
  owns_tis the policy term enters as it is) and aggregates it; every entry of `metrics` is reported as its
  aggregation-weighted mean over loss tokens."""
  policy: jax.Array
  extra: jax.Array | float = 0.0
  metrics: dict[str, jax.Array] = dataclasses.field(default_factory=dict)
  owns_tis: bool = False  # `policy` carries the loss's own importance weight: the step adds no w_t


# The optional TokenInputs a loss may need, and the LearnerConfig field (and test) that turns each on.
OPTIONAL_INPUTS: dict[str, tuple[str, Callable[[LearnerConfig], bool], str]] = {
    "values": ("value.kind", lambda cfg: cfg.value.kind != "none", "set it to 'shared' or 'separate'"),
    "values_old": ("value.kind", lambda cfg: cfg.value.kind != "none", "set it to 'shared' or 'separate'"),
    "logp_ref": ("kl_coef", lambda cfg: cfg.kl_coef > 0, "set it > 0 (log pi_ref is computed only then)"),
}


@dataclasses.dataclass(frozen=True)
class LossSpec:
  fn: Callable[..., LossTerms]
  needs: frozenset[str] = frozenset()  # optional TokenInputs the loss reads (OPTIONAL_INPUTS)
  options: type | None = None          # a dataclass of the loss's options (LearnerConfig.loss_kwargs)
  aggregation: str | None = None       # the loss's own aggregation, where the config names none
  sequence: bool = False               # reads rollout structure (rollout_mean / rollout_sum)
  entropy_grad: bool = False           # differentiates x.entropy

  def options_of(self, cfg: LearnerConfig, where: str = "config.learner") -> Any:
    """The loss's options from cfg.loss_kwargs: a ConfigError naming the key when one is unknown or of
    the wrong type."""
    if self.options is None:
      if cfg.loss_kwargs:
        raise ConfigError(f"{where}.loss_kwargs: loss {cfg.loss!r} declares no options, got "
                          f"{sorted(cfg.loss_kwargs)}")
      return None
    return config_lib.from_mapping(self.options, dict(cfg.loss_kwargs), f"{where}.loss_kwargs")

  def aggregation_of(self, cfg: LearnerConfig) -> str:
    """The aggregation the step applies: the config's, else the loss's own, else "token"."""
    return cfg.aggregation or self.aggregation or "token"

  def __call__(self, x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
    if self.options is None:
      return self.fn(x, cfg)
    return self.fn(x, cfg, self.options_of(cfg))


LOSSES: dict[str, LossSpec] = {}


def register_loss(name: str, *, needs: Sequence[str] = (), options: type | None = None,
                  aggregation: str | None = None, sequence: bool = False, entropy_grad: bool = False):
  """Decorator: make `fn(inputs, config) -> LossTerms` available as LearnerConfig(loss=name).

  needs: optional inputs it reads (OPTIONAL_INPUTS), refused at parse time when the config has them off.
  options: a dataclass of typed options with defaults, filled from LearnerConfig.loss_kwargs and passed
    as a third argument, fn(inputs, config, options).
  aggregation: the aggregation it is defined with (AGGREGATIONS), applied where the config names none.
  sequence: it calls rollout_mean / rollout_sum (a rollout must lie in one row).
  entropy_grad: it differentiates x.entropy (an entropy bonus)."""
  unknown = sorted(set(needs) - set(OPTIONAL_INPUTS))
  if unknown:
    raise ValueError(f"register_loss({name!r}): needs={unknown} are not optional inputs {sorted(OPTIONAL_INPUTS)}")
  if aggregation not in (None, *AGGREGATIONS):
    raise ValueError(f"register_loss({name!r}): aggregation={aggregation!r} is not one of {AGGREGATIONS}")
  if options is not None and not dataclasses.is_dataclass(options):
    raise ValueError(f"register_loss({name!r}): options must be a dataclass, got {options!r}")

  def wrap(fn):
    if name in LOSSES:
      raise ValueError(f"loss {name!r} is already registered")
    LOSSES[name] = LossSpec(fn, frozenset(needs), options, aggregation, sequence, entropy_grad)
    return fn

  return wrap


def check_loss(cfg: LearnerConfig, where: str = "config.learner") -> LossSpec:
  """The registered loss of `cfg`; a ConfigError naming the field when it is unknown, when an input it
  needs is off, or when its options are wrong."""
  if cfg.loss not in LOSSES:
    close = difflib.get_close_matches(cfg.loss, list(LOSSES), n=3, cutoff=0.7)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"{where}.loss: {cfg.loss!r} is not a registered loss {sorted(LOSSES)}{hint} "
                      "(a loss of your own: --config.plugins=MODULE)")
  spec = LOSSES[cfg.loss]
  for name in sorted(spec.needs):
    field, enabled, how = OPTIONAL_INPUTS[name]
    if not enabled(cfg):
      raise ConfigError(f"{where}.{field}: loss {cfg.loss!r} reads {name}, which is off; {how}")
  spec.options_of(cfg, where)
  if spec.aggregation_of(cfg) == "constant" and cfg.aggregation_tokens is None:
    raise ConfigError(f"{where}.aggregation_tokens: aggregation 'constant' needs it (the fixed token count "
                      "each rollout's sum is divided by)")
  return spec


# ---- rollout-level reductions ------------------------------------------------------------------------


def _token_weight(x: TokenInputs, weight: str) -> jax.Array:
  if x.rollout is None or x.unique_weight is None or x.path_weight is None:
    raise ValueError("TokenInputs without rollout structure (rollout, unique_weight, path_weight): the learner "
                     "fills them; a TokenInputs built by hand must too")
  if weight not in ("unique", "paths"):
    raise ValueError(f"rollout weight {weight!r}: 'unique' or 'paths'")
  return x.unique_weight if weight == "unique" else x.path_weight


def rollout_sum(values: jax.Array, x: TokenInputs, weight: str = "unique") -> jax.Array:
  """Each token's rollout's weighted sum, sum_{s in its rollout} w_s values_s, broadcast back to the
  rollout's tokens (0 on padding). weight "unique": w = 1 on each trained token of the rollout, once
  however many kept paths hold it (the rollout's "sequence" is its unique trained tokens); "paths": w = the
  number of kept root-to-leaf paths through the token, what an implementation that trained each path as a
  sequence of its own would sum over the rollout's paths. A segment sum inside each row (jit-safe)."""
  w = _token_weight(x, weight)
  k = values.shape[-1]
  ids = jnp.maximum(x.rollout, 0).reshape(-1, k)
  sums = jax.vmap(lambda v, i: jax.ops.segment_sum(v, i, num_segments=k))((w * values).reshape(-1, k), ids)
  back = jnp.take_along_axis(sums, ids, axis=-1).reshape(values.shape)
  return jnp.where(x.rollout >= 0, back, 0.0)


def rollout_mean(values: jax.Array, x: TokenInputs, weight: str = "unique") -> jax.Array:
  """Each token's rollout's weighted mean of `values`, broadcast back to the rollout's tokens (0 on
  padding): rollout_sum(values) / rollout_sum(1), with the weights of `rollout_sum` ("unique": the mean
  over the rollout's unique trained tokens; "paths": the mean over every token of every kept path)."""
  total = rollout_sum(jnp.ones_like(values), x, weight)
  return rollout_sum(values, x, weight) / jnp.where(total > 0, total, 1.0)


# ---- the importance weight and the surrogates ----------------------------------------------------------


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


def _with_kl(x: TokenInputs, cfg: LearnerConfig, loss: jax.Array, metrics: dict) -> tuple[jax.Array, dict]:
  """A policy loss plus kl_coef times the KL penalty. Both are scaled by the TIS weight in the step: the
  penalty's samples come from pi_rollout too, and w corrects them toward pi_old."""
  metrics["policy_loss"] = loss
  if cfg.kl_coef:
    kl = KL_PENALTIES[cfg.kl_estimator](x.logp, x.logp_ref)
    metrics["kl_ref"] = kl
    loss = loss + cfg.kl_coef * kl
  return loss, metrics


@dataclasses.dataclass(frozen=True)
class GroupAdvantage:
  """The options of the losses that train on GRPO's group advantage."""
  # True: A = (R - mean_g) / (std_g + eps) (GRPO, DeepSeekMath). False: A = R - mean_g (Dr. GRPO,
  # arXiv 2503.20783: dividing by the group's std weighs too easy and too hard tasks up).
  advantage_std: bool = True


def group_advantage(x: TokenInputs, opt: GroupAdvantage) -> jax.Array:
  return x.advantages if opt.advantage_std else jnp.where(x.mask, x.returns - x.baselines, 0.0)


@register_loss("grpo", options=GroupAdvantage)
def grpo(x: TokenInputs, cfg: LearnerConfig, opt: GroupAdvantage = GroupAdvantage()) -> LossTerms:
  """Eq. 1: the token-level clipped surrogate on the group advantage,
      loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A),  r_t = pi_theta(a_t|s_t) / pi_old(a_t|s_t),
  plus kl_coef x the KL penalty. Dr. GRPO (arXiv 2503.20783) is this loss without the std and with a
  constant normaliser:
      --config.learner.loss=grpo --config.learner.loss_kwargs.advantage_std=False
      --config.learner.aggregation=constant --config.learner.aggregation_tokens=4096"""
  loss, metrics = _with_kl(x, cfg, *clipped_surrogate(x.logp, x.logp_old, group_advantage(x, opt), cfg.eps_low,
                                                       cfg.eps_high, cfg.max_log_ratio))
  return LossTerms(loss, metrics=metrics)


@dataclasses.dataclass(frozen=True)
class GSPOOptions(GroupAdvantage):
  # The sequence ratio's own clip range, far narrower than a token ratio's: GSPO (arXiv 2507.18071,
  # Sec. 5.1) trains Qwen3 with 3e-4 below and 4e-4 above.
  eps_low: float = 3e-4
  eps_high: float = 4e-4
  weight: str = "unique"  # the rollout mean's weights (rollout_mean): "unique" tokens, or "paths"
  # "token": the step's per-token TIS weight w_t scales each token's term (as with grpo). "sequence": the
  # loss weighs a rollout's tokens by one w_i = min(exp(mean_t(log pi_old - log pi_rollout)), c_bar), the
  # geometric mean of its token ratios, as the sequence ratio measures pi_theta against pi_old.
  tis: str = "token"

  def __post_init__(self):
    if self.weight not in ("unique", "paths") or self.tis not in ("token", "sequence"):
      raise ValueError(f"weight={self.weight!r} must be 'unique' or 'paths', tis={self.tis!r} 'token' or 'sequence'")


@register_loss("gspo", options=GSPOOptions, aggregation="rollout", sequence=True)
def gspo(x: TokenInputs, cfg: LearnerConfig, opt: GSPOOptions) -> LossTerms:
  """GSPO (arXiv 2507.18071), in its GSPO-token form: the sequence ratio of rollout i,
      s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|) = exp(mean_t log(pi_theta / pi_old)),
  clipped per rollout to [1 - eps_low, 1 + eps_high] (its own eps, loss_kwargs), enters each token as
      s_i,t = sg(s_i) pi_theta(y_i,t) / sg(pi_theta(y_i,t)),  loss_t = -min(s_i,t A_i, clip(s_i,t) A_i):
  s_i,t equals s_i, and its gradient is s_i grad log pi_theta(y_i,t), so with the "rollout" aggregation
  (its own: a config that names another overrides it) the step's loss and gradient are the paper's
  -1/G sum_i min(s_i A_i, clip(s_i) A_i).  A rollout is a tree: |y_i| counts its unique trained tokens
  (weight="paths": every token of every kept path).
  TIS: by default each token's term is scaled by its w_t (the step's); tis="sequence" scales a rollout's
  terms by one w_i, the truncated geometric mean of its tokens' pi_old / pi_rollout.
      --config.learner.loss=gspo --config.learner.loss_kwargs="{'eps_low': 3e-4, 'eps_high': 4e-4}" """
  adv = group_advantage(x, opt)
  log_s = rollout_mean(x.logp - x.logp_old, x, opt.weight)
  token_log_s = jax.lax.stop_gradient(log_s) + x.logp - jax.lax.stop_gradient(x.logp)
  loss, metrics = _with_kl(x, cfg, *clipped_surrogate(token_log_s, 0.0, adv, opt.eps_low, opt.eps_high,
                                                      cfg.max_log_ratio))
  metrics["sequence_ratio"] = jnp.exp(jax.lax.stop_gradient(log_s))
  if opt.tis == "token":
    return LossTerms(loss, metrics=metrics)
  w_seq = jnp.minimum(jnp.exp(rollout_mean(x.logp_old - x.logp_rollout, x, opt.weight)), cfg.c_bar)
  metrics["sequence_tis"] = w_seq
  return LossTerms(jax.lax.stop_gradient(w_seq) * loss, metrics=metrics, owns_tis=True)


@dataclasses.dataclass(frozen=True)
class CISPOOptions(GroupAdvantage):
  # The importance weight's clip: MiniMax-M1 (arXiv 2506.13585) sets no lower bound (eps_low 1: the
  # weight stays >= 0) and tunes only eps_high, whose value it does not publish; 0.28 is the default of
  # peer implementations (Trinity-RFT), the clip-higher of DAPO.
  eps_low: float = 1.0
  eps_high: float = 0.28


@register_loss("cispo", options=CISPOOptions)
def cispo(x: TokenInputs, cfg: LearnerConfig, opt: CISPOOptions) -> LossTerms:
  """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4): the clipped importance weight with its gradient
  stopped, times log pi_theta,
      loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A log pi_theta(a_t|s_t),  r_t = pi_theta / pi_old,
  so a clipped token still carries gradient (only its weight is bounded), where the clipped surrogate
  drops it. The step's TIS weight w_t scales it as it does grpo's term.
      --config.learner.loss=cispo --config.learner.loss_kwargs.eps_high=0.28"""
  log_ratio = jnp.clip(x.logp - x.logp_old, -cfg.max_log_ratio, cfg.max_log_ratio)
  ratio = jax.lax.stop_gradient(jnp.exp(log_ratio))
  weight = jnp.clip(ratio, 1.0 - opt.eps_low, 1.0 + opt.eps_high)
  loss = -weight * group_advantage(x, opt) * x.logp
  lr = jax.lax.stop_gradient(log_ratio)
  metrics = {"clip_fraction": (weight != ratio).astype(jnp.float32), "approx_kl": jnp.expm1(lr) - lr}
  loss, metrics = _with_kl(x, cfg, loss, metrics)
  return LossTerms(loss, metrics=metrics)


def value_loss(values: jax.Array, values_old: jax.Array, returns: jax.Array, clip: float | None) -> jax.Array:
  """0.5 (V - R)^2, or with clip the PPO2 pessimistic max over V and V_old + clip(V - V_old)."""
  err = jnp.square(values - returns)
  if clip is None:
    return 0.5 * err
  v_clipped = values_old + jnp.clip(values - values_old, -clip, clip)
  return 0.5 * jnp.maximum(err, jnp.square(v_clipped - returns))


@register_loss("ppo", needs=("values", "values_old"))
def ppo(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
  """Eq. 2 with branch-local GAE at gamma = lambda = 1: A_t = R - V_old(s_t), plus the value loss (in
  `extra`: the critic learns only from what a loss puts there)."""
  advantages = x.returns - x.values_old
  loss, metrics = _with_kl(x, cfg, *clipped_surrogate(x.logp, x.logp_old, advantages, cfg.eps_low, cfg.eps_high,
                                                       cfg.max_log_ratio))
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
