"""A seconds-long offline check of a loss: a tiny policy and packed batches shaped like agent training data.

  from clawjax.rl.config import LearnerConfig
  from clawjax.rl.learner import Learner
  from clawjax.rl.loss_check import example_batch, tiny_policy

  learner = Learner(LearnerConfig(loss="my_loss", logits_chunk=64), tiny_policy())
  loss, grads, metrics = learner.loss_and_grads(example_batch())

`example_batch` packs what a training step packs (clawjax.train.step_data): synthetic harness calls
(clawjax.tree.synthetic: a tool loop with a retry, parallel tool calls and a compaction) of three GRPO
groups, filtered into trees with the retries kept (so each tree branches, and the sampled turn before a
retry lies on two kept paths), with group advantages, packed by pack_trees with shared prompts, several
rollouts a row, and an empty row of padding. The policy is a
one-layer Decoder over a 256-token vocabulary: a step compiles in seconds on a CPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flax import nnx

from clawjax.calllog import RolloutRecord
from clawjax.models.config import PRESETS, ModelConfig
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree import synthetic
from clawjax.tree.batch import PackedBatch, RolloutScores
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.pack import pack_trees

TINY: ModelConfig = PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=256)
PATTERNS = ("retry", "parallel_tools", "compaction")


def tiny_policy(seed: int = 0) -> Decoder:
  return Decoder(TINY, rngs=nnx.Rngs(seed))


def example_trees(seed: int = 0, groups: int = 3, rollouts: int = 3, patterns: tuple[str, ...] = PATTERNS
                  ) -> tuple[list[CallTree], RolloutScores]:
  """The kept trees of `groups` GRPO groups of `rollouts` synthetic rollouts each (one task per group,
  its prompt shared; 2 to 4 calls a rollout, so that rollouts differ in length; rewards uniform in
  [0, 1)), and their scores."""
  rng = np.random.default_rng(seed)
  calls, outcomes = [], []
  for g in range(groups):
    prompt = synthetic.task_prompt(rng, 24, TINY.vocab_size)
    for k in range(rollouts):
      rid = f"task{g}/{k}"
      calls += synthetic.agent_rollout(rng, rollout_id=rid, task_id=f"task{g}", prompt_ids=prompt,
                                       n_calls=int(rng.integers(2, 5)), tokens_per_call=8,
                                       vocab_size=TINY.vocab_size, patterns=patterns)
      outcomes.append(RolloutRecord(rid, f"task{g}", "synthetic", float(rng.random()), "ok"))
  ids = list(dict.fromkeys(c.rollout_id for c in calls))
  keep_retries = FilterConfig(drop_retries=False)
  trees = [filter_rollout(rid, [c for c in calls if c.rollout_id == rid], keep_retries).tree for rid in ids]
  return trees, grpo_advantages(outcomes)


def example_batch(seed: int = 0, trees: list[CallTree] | None = None, scores: RolloutScores | None = None
                  ) -> PackedBatch:
  """`example_trees(seed)` (or the trees given) packed as training packs them: prompts shared within a
  group, rows of room for two groups' merged trees (three groups fill two rows), and one empty row."""
  if trees is None:
    trees, scores = example_trees(seed)
  one_row = pack_trees(trees, scores, row_len=sum(t.size for t in trees), share_prompts=True)
  segment = one_row.segment_ids_RT[0]
  row_len = -(-2 * int(np.bincount(segment[segment > 0]).max()) // 64) * 64
  rows = pack_trees(trees, scores, row_len=row_len, share_prompts=True).shape[0]
  return pack_trees(trees, scores, row_len=row_len, rows=rows + 1, share_prompts=True)


def with_logprobs(tree: CallTree, logprobs_T: np.ndarray) -> CallTree:
  """`tree` with other rollout log-probs on its sampled tokens (0 on context, as the tree keeps them)."""
  return dataclasses.replace(tree, logprobs_T=np.where(tree.owner_T >= 0, logprobs_T, 0).astype(np.float32))
