"""The packed token batch: what the tree stage hands to the learner.

Two layouts share this one record type:

* tree layout (`pack.pack_trees`): each kept rollout tree is flattened in depth-first pre-order, so the
  subtree of token j is the contiguous range [j, subtree_end[j]). Several trees share a row, one segment
  each; a shared prefix appears once. With prompt sharing (`pack_trees(..., share_prompts=True)`) the
  trees of one GRPO group are merged into one segment: their common task prompt (untrained context
  only) once, then each tree's remaining tokens, the first of them a child of the prompt's last token.
  Groups are never merged with each other.
* paths layout (`pack.pack_paths`): one row segment per kept root-to-leaf path, a plain causal sequence.
  It is the reference the tree layout must agree with, and costs `path_tokens` instead of
  `unique_tokens`.

Attention rule, the same in both layouts: query i may attend to key j iff
  segment_ids[i] == segment_ids[j] > 0  and  j <= i < subtree_end[j].
(In the paths layout subtree_end[j] is the end of j's segment, which makes the rule causal.) Segment ids
are 1, 2, ... for the row's segments and 0 for padding; a negative id is refused here, and every attention
implementation reads one as padding (clawjax/kernels/tree_attention/mask.py).

Prediction rule: the logits at position parent_index[i] predict token i (-1: nothing predicts it, as
for a segment's first token and padding). In the tree layout that is the token's tree parent, which at a
branch start is not i - 1.

Loss weights: a token's loss enters as sum(weight * token_loss) / sum(weight) over the whole global
batch, with one of two weightings:
  unique_weight: 1 on every sampled token that is trained (each counted once per rollout: the paper's
    "a shared prefix token enters the loss once"); in the paths layout it is 1 only at the first
    occurrence of a token across the rollout's paths.
  path_weight: the number of kept root-to-leaf paths through the token (the average over paths); in the
    paths layout 1 on every trained token of every path.
Both are 0 on context, filtered calls and padding.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# A training step's GRPO advantages, {rollout_id: A} as JSON, beside its rollout records
# (WORKDIR/steps/step_<k>/): what the rollout-tree viewer shows on each loss token. (With the ppo loss the
# learner uses A_t = R - V(s_t) instead, which is not written.)
ADVANTAGES_FILE = "advantages.json"
# The learner's pi_old log-prob and TIS weight of each loss token of a step's best and worst rollouts
# (clawjax/train/learner_view.py writes it for the last step), beside the advantages.
LEARNER_FILE = "learner_tokens.json"


@dataclasses.dataclass
class PackedBatch:
  """Arrays of shape [rows, row_len] (suffix _RT), plus per-rollout tables (suffix _N)."""
  tokens_RT: np.ndarray           # int32 token ids; 0 on padding
  positions_RT: np.ndarray        # int32 depth in the tree (root token = 0): the RoPE position
  parent_index_RT: np.ndarray     # int32 index in the row of the token whose logits predict this one; -1
  subtree_end_RT: np.ndarray      # int32 exclusive end of the token's subtree (padding: i + 1)
  segment_ids_RT: np.ndarray      # int32 1.. per tree or merged group (tree layout) or path; 0 = padding; never < 0
  unique_weight_RT: np.ndarray    # float32, see the module docstring
  path_weight_RT: np.ndarray      # float32, see the module docstring
  rollout_logprobs_RT: np.ndarray  # float32 engine log-prob of each sampled token; 0 elsewhere
  advantages_RT: np.ndarray       # float32 per-token advantage (GRPO: the rollout's A); 0 elsewhere
  returns_RT: np.ndarray          # float32 the rollout's reward R on trained tokens (PPO: A_t = R - V)
  baselines_RT: np.ndarray        # float32 the mean reward of the rollout's GRPO group on trained tokens
  # int32 index into the _N tables; -1 on padding. A prompt shared by a merged group carries its
  # segment's first rollout (it is context: no weight, advantage or return reads it).
  rollout_index_RT: np.ndarray
  rollout_ids_N: list[str]        # the rollouts packed, in rollout_index order
  group_ids_N: np.ndarray         # int32 GRPO group of each rollout (one (task, harness) pair each)
  rewards_N: np.ndarray           # float32 reward of each rollout
  # The engine's routed experts of each token [rows, row_len, layers, top_k] (uint8 / uint16, layers as the
  # engine reported them: clawjax.routes), aligned with tokens_RT, and which tokens have one; None when
  # no packed rollout logged routes.
  routes_RTLK: np.ndarray | None = None
  routed_RT: np.ndarray | None = None

  def __post_init__(self):
    if np.size(self.segment_ids_RT) and np.min(self.segment_ids_RT) < 0:
      row, col = (int(i[0]) for i in np.nonzero(np.asarray(self.segment_ids_RT) < 0))
      raise ValueError(f"PackedBatch.segment_ids_RT: negative segment id {int(self.segment_ids_RT[row, col])} at "
                       f"row {row}, position {col} (segments are 1, 2, ...; padding is 0)")

  @property
  def shape(self) -> tuple[int, int]:
    return self.tokens_RT.shape

  def loss_mask_RT(self) -> np.ndarray:
    """Tokens that enter the loss under either weighting (in the paths layout a repeated token has
    path_weight 1 but unique_weight 0)."""
    return (self.unique_weight_RT > 0) | (self.path_weight_RT > 0)


# A GRPO group: (task_id, harness, draw), draw the index of the group in the run's data order
# (clawjax.train.groups), or None for rollouts whose records name no group.
GroupKey = tuple[str, str, int | None]


@dataclasses.dataclass
class RolloutScores:
  """Per-rollout reward, group and advantage (suffix _N), for the rollouts that can be trained."""
  rollout_ids: list[str]
  group_ids_N: np.ndarray          # int32 index into `groups`
  rewards_N: np.ndarray            # float32
  advantages_N: np.ndarray         # float32 GRPO advantage
  baselines_N: np.ndarray          # float32 the mean reward of the rollout's group (A without std: R - it)
  groups: list[GroupKey]           # each group's (task_id, harness, draw): a pair drawn twice is two groups
  singleton_groups: int            # groups with one rollout (A = 0)
  zero_variance_groups: int        # groups of >= 2 rollouts with equal rewards (A = 0)

  def index(self) -> dict[str, int]:
    return {rid: i for i, rid in enumerate(self.rollout_ids)}

  def by_rollout(self) -> dict[str, float]:
    """{rollout_id: advantage}: the contents of ADVANTAGES_FILE."""
    return {rid: float(a) for rid, a in zip(self.rollout_ids, self.advantages_N)}
