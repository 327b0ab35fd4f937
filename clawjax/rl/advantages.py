"""Advantages: GRPO group normalisation (paper Eq. 1), and what branch-local PPO advantages (Eq. 2) are.

GRPO: A_i = (R_i - mean_g) / (std_g + eps) over the rollouts of group g = one draw of a (task_id,
harness) pair: the rollouts a step's task sample launched together (clawjax.train.groups; their records
carry the group's index, `extra["group"]`). The same task under two harnesses forms two groups, and so
does the same pair drawn twice (two steps' samples trained in one asynchronous step): groups never mix
harnesses or draws. Records without a group index (older logs) group by the pair alone. std is the
population standard deviation (ddof=0): the group is the whole set being normalised, not a sample of
a larger one, and it stays defined for a group of one. (Libraries that use the sample std, ddof=1,
divide by a larger std and so give advantages smaller by the factor sqrt((n - 1) / n): 6.5% smaller
for n = 8.) A group of one rollout, or one whose
rewards are all equal, carries no learning signal: its advantages are exactly 0 and it is counted.
Each rollout also keeps its group's mean reward, `baselines_N` (its own reward in a group without
signal), which the packer writes on its tokens: Dr. GRPO's advantage R - mean, without the std (the
group-advantage losses' `advantage_std=False`, clawjax.rl.losses).

PPO with gamma = lambda = 1: the GAE sum of TD errors along a trajectory telescopes to
A_t = R - V(s_t), with returns = R. The learner computes it in the `ppo` loss (clawjax.rl.losses) from
V(s_t), the critic's value of the state in which token t was sampled, read at the position that
predicts t (`parent_index`). In the tree layout that state is the token's root-to-parent path, so no
sibling branch enters it: advantages never cross a branch point.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from clawjax.calllog import RolloutRecord
from clawjax.tree.batch import GroupKey, RolloutScores


def group_key(record: RolloutRecord) -> GroupKey:
  """(task_id, harness, draw): the GRPO group of a rollout; draw is its group's index in the run's data
  order, None for a record that names none."""
  draw = (record.extra or {}).get("group")
  return record.task_id, record.harness, None if draw is None else int(draw)


def grpo_advantages(rollouts: Iterable[RolloutRecord], eps: float = 1e-6) -> RolloutScores:
  """Group-normalised advantages of the rollouts with status "ok" (the others have no reward).

  `eps` keeps the division finite for nearly equal rewards; 1e-6 is far below any reward resolution
  of the verifiers (scores in [0, 1] averaged over a handful of checks) so it never rescales a group.
  """
  if eps <= 0:
    raise ValueError(f"eps must be > 0, got {eps}")
  ok = sorted((r for r in rollouts if r.status == "ok" and r.reward is not None),
              key=lambda r: r.rollout_id)
  groups = sorted({group_key(r) for r in ok}, key=lambda g: (g[0], g[1], -1 if g[2] is None else g[2]))
  group_of = {g: i for i, g in enumerate(groups)}
  group_ids = np.array([group_of[group_key(r)] for r in ok], np.int32)
  rewards = np.array([r.reward for r in ok], np.float64)
  advantages = np.zeros(len(ok), np.float64)
  baselines = rewards.copy()  # a group of one, or of equal rewards, is its own baseline: R - b = 0 exactly
  singleton = zero_var = 0
  for g in range(len(groups)):
    members = group_ids == g
    r = rewards[members]
    if len(r) == 1:
      singleton += 1
    elif r.max() == r.min():
      zero_var += 1
    else:
      baselines[members] = r.mean()
      advantages[members] = (r - r.mean()) / (r.std() + eps)
  return RolloutScores(rollout_ids=[r.rollout_id for r in ok], group_ids_N=group_ids,
                       rewards_N=rewards.astype(np.float32), advantages_N=advantages.astype(np.float32),
                       baselines_N=baselines.astype(np.float32),
                       groups=groups, singleton_groups=singleton, zero_variance_groups=zero_var)
