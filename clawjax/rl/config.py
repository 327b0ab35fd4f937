"""The learner's configuration: every hyperparameter of the loss and the update, with its default.

The paper (ClawGym II) publishes none of the optimisation values; defaults follow the ClawGym part-I
recipe where it gives one (lr 1e-6, clip 0.2 / 0.28, KL 0) and otherwise common practice (named below).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from clawjax.config import Count, FractionBelow1, NonNegative, Positive

# How the step sums a batch's per-token losses into one (clawjax.rl.device_batch.aggregation_weights):
#   "token"     sum over trained tokens / their number, a token shared by several kept paths counted once
#   "paths"     each token weighted by the kept root-to-leaf paths through it: the mean over paths' tokens
#   "rollout"   the mean over each rollout's tokens, then the mean over rollouts (each weighs the same)
#   "constant"  each rollout's token sum / aggregation_tokens, then the mean over rollouts (Dr. GRPO)
AGGREGATIONS = ("token", "paths", "rollout", "constant")
# The old field `normalisation`, and the aggregation each of its values names.
NORMALISATIONS = {"unique": "token", "paths": "paths"}
VALUE_KINDS = ("none", "shared", "separate")
OPTIMIZERS = ("adamw", "sgd")
KL_ESTIMATORS = ("k3", "k2")
ROUTING_REPLAY = ("auto", "rollout", "off")


@dataclasses.dataclass(frozen=True)
class ValueConfig:
  """The critic for PPO (Eq. 2: A_t = R - V(s_t), gamma = lambda = 1)."""
  kind: str = "none"          # "none"; "shared": a linear head on the policy trunk; "separate": own trunk
  coef: NonNegative[float] = 0.5  # weight of the value loss next to the policy loss (common PPO value)
  clip: Positive[float] | None = 0.2  # value clipping around V_old (PPO2 style); None = plain squared error
  pretrain_lr: Positive[float] = 1e-5  # learning rate of `Learner.pretrain_value_step` (the paper pretrains V)
  # Learning rate of the critic's parameters in the RL updates (its own optimizer state and its own
  # gradient-norm clip at LearnerConfig.grad_clip). Not published; critics usually learn faster than
  # the policy (10x here, as the pretraining default).
  lr: Positive[float] = 1e-5
  # "separate" only: take the critic's gradient after the policy's backward, from a second forward of its
  # trunk, so the two trunks' saved activations are never live together (memory of one trunk for one
  # more critic forward per micro-batch). Off: one joint backward.
  two_pass: bool = False


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  loss: str = "grpo"               # a name in clawjax.rl.losses.LOSSES (register your own there)
  lr: Positive[float] = 1e-6       # ClawGym part I
  warmup_steps: NonNegative[int] = 0  # linear warm-up from 0 to lr
  optimizer: str = "adamw"         # "adamw" | "sgd"
  adam_b1: FractionBelow1 = 0.9
  adam_b2: FractionBelow1 = 0.999
  adam_eps: Positive[float] = 1e-8
  weight_decay: NonNegative[float] = 0.0
  # Clip by global norm, the policy's and the critic's gradients each by its own norm; None = off.
  grad_clip: Positive[float] | None = 1.0
  eps_low: FractionBelow1 = 0.2    # ratio clip below: 1 - eps_low (ClawGym part I)
  eps_high: NonNegative[float] = 0.28  # ratio clip above: 1 + eps_high (ClawGym part I, "clip higher")
  kl_coef: NonNegative[float] = 0.0  # KL penalty to the frozen initial policy; 0 = no reference model
  # The per-token KL estimate used as the penalty (clawjax.rl.losses.kl_penalty): "k3" (GRPO's; its
  # gradient is that of KL(pi_ref || pi_theta)) or "k2" (gradient of KL(pi_theta || pi_ref)).
  kl_estimator: str = "k3"
  c_bar: Positive[float] = 2.0     # TIS truncation: w_t = min(pi_old / pi_rollout, c_bar) (peer systems)
  # |log pi_theta - log pi_old| is clamped here before exp in the clipped surrogate: with epochs or
  # minibatches > 1 the ratio can move far, and exp(89) overflows float32 to inf (NaN loss). A clamped
  # token gets no gradient through the ratio, as PPO's clip gives none past 1 +- eps.
  max_log_ratio: Positive[float] = 20.0
  temperature: Positive[float] = 1.0  # MUST equal the rollout sampling temperature: logp = log_softmax(z / T)
  # How per-token losses become the batch's loss (AGGREGATIONS above); None: the loss's own (gspo's is
  # "rollout", register_loss(aggregation=...)), else "token" (the paper's).
  aggregation: str | None = None
  # "constant" only: the fixed token count each rollout's sum is divided by (Dr. GRPO divides by the
  # generation budget). No default: it depends on the harness's context, so it must be set.
  aggregation_tokens: Count | None = None
  normalisation: str | None = None  # the old name: "unique" = aggregation "token", "paths" = "paths"
  micro_batches: Count = 1         # micro-batches per batch: rows split evenly, gradients accumulated
  # Several optimizer updates per batch (PPO-style reuse), pi_old / V_old / pi_ref frozen before the
  # first: `epochs` passes over the batch, each of `minibatches` updates. A minibatch is 1/minibatches of
  # the batch's rows (each process's rows split evenly, in order), laid out as micro_batches / minibatches
  # micro-batches (so minibatches must divide micro_batches, which only sets memory: it never changes
  # which rows form a minibatch), normalised by its own weight sum. Whole rows: a tree is never split.
  epochs: Count = 1                # 1 = a single pass (PPO paper, Schulman et al. 2017: 3 Atari, 10 MuJoCo)
  minibatches: Count = 1           # optimizer updates per epoch
  shuffle: bool = False            # per epoch, deal whole rows into minibatches by a random permutation
  logits_chunk: Count = 512        # loss tokens per vocab-projection chunk (memory: rows x chunk x vocab)
  seed: int = 0                    # seeds the learner RNG carried in the train state and checkpoints
  # Rollout routing replay (clawjax.models.routing) for a MoE policy: "auto" replays the engine's logged
  # expert choices when the model is MoE and the step's calls carry routes; "rollout" always replays (a
  # step without routes is an error); "off" routes live. Tokens without a route route live either way.
  routing_replay: str = "auto"
  value: ValueConfig = ValueConfig()
  # The loss's options, checked against the ones it declares (register_loss(options=...)): an unknown
  # name or a wrong type is an error before anything starts. E.g. {"advantage_std": False} for grpo.
  loss_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    _check_name("normalisation", self.normalisation, tuple(NORMALISATIONS))
    _check_name("aggregation", self.aggregation, AGGREGATIONS)
    if self.normalisation is not None:
      named = NORMALISATIONS[self.normalisation]
      if self.aggregation not in (None, named):
        raise ValueError(f"LearnerConfig.normalisation={self.normalisation!r} (aggregation {named!r}) contradicts "
                         f"aggregation={self.aggregation!r}; set aggregation alone")
      object.__setattr__(self, "aggregation", named)
    if self.aggregation_tokens is not None and self.aggregation_tokens < 1:
      raise ValueError(f"LearnerConfig.aggregation_tokens={self.aggregation_tokens} must be >= 1")
    if self.aggregation == "constant" and self.aggregation_tokens is None:
      raise ValueError("LearnerConfig.aggregation='constant' needs aggregation_tokens (the fixed token count "
                       "each rollout's sum is divided by)")
    if self.value.kind not in VALUE_KINDS:
      raise ValueError(f"LearnerConfig.value.kind={self.value.kind!r}: use one of {VALUE_KINDS}")
    if self.value.two_pass and self.value.kind != "separate":
      raise ValueError(f"LearnerConfig.value.two_pass needs value.kind='separate' (a critic with its own "
                       f"trunk), not {self.value.kind!r}")
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"LearnerConfig.optimizer={self.optimizer!r}: use one of {OPTIMIZERS}")
    if self.routing_replay not in ROUTING_REPLAY:
      raise ValueError(f"LearnerConfig.routing_replay={self.routing_replay!r}: use one of {ROUTING_REPLAY}")
    if self.kl_estimator not in KL_ESTIMATORS:
      raise ValueError(f"LearnerConfig.kl_estimator={self.kl_estimator!r}: use one of {KL_ESTIMATORS}")
    for name in ("micro_batches", "logits_chunk", "epochs", "minibatches"):
      if getattr(self, name) < 1:
        raise ValueError(f"LearnerConfig.{name}={getattr(self, name)} must be >= 1")
    if self.micro_batches % self.minibatches:
      raise ValueError(f"LearnerConfig.minibatches={self.minibatches} must divide micro_batches="
                       f"{self.micro_batches}: a minibatch is a group of consecutive micro-batches")
    if self.temperature <= 0 or self.c_bar <= 0 or self.max_log_ratio <= 0:
      raise ValueError("LearnerConfig.temperature, c_bar and max_log_ratio must be > 0")


def _check_name(field: str, value: str | None, allowed: tuple[str, ...]) -> None:
  if value is None or value in allowed:
    return
  close = difflib.get_close_matches(str(value), allowed, n=2, cutoff=0.5)
  hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
  raise ValueError(f"LearnerConfig.{field}={value!r}: use one of {allowed}{hint}")
