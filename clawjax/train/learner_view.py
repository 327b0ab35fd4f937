"""The learner's side of a step for the rollout-tree viewer: per loss token, the log-prob under pi_old (the
policy the step's update starts from, as the learner recomputes it) and the truncated importance weight
w = min(exp(logp_old - logp_rollout), c_bar) that TIS applies, for a step's best and worst rollouts.

The learner computes these inside its jitted step and returns only their means; this recomputes them for a
few rollouts with the same model, the same tree layout (positions at tree depth, tree attention) and the
same formula (clawjax/rl/logprobs.py), one rollout tree per forward pass. The trainer calls it before the
last step's update; the result, {rollout_id: [[call_index, depth, logp_old, w, truncated], ...]} with the
step's c_bar, goes to steps/step_<k>/LEARNER_FILE, which the viewer reads beside the advantages.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax.calllog import load
from clawjax.rl.config import LearnerConfig
from clawjax.rl.logprobs import token_logprobs
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout

SHOWN = 3  # best and worst rollouts by reward: the ones the run report lists


@nnx.jit(static_argnames=("temperature", "chunk"))
def _tree_logprobs(model, tokens_T, depth_T, segment_T, subtree_end_T, pred_K, targets_K, *, temperature: float,
                   chunk: int):
  hidden = model.hidden(tokens_T[None], depth_T[None], segment_T[None], subtree_end_T[None])
  logp, _ = token_logprobs(model.logits, hidden[:, pred_K], targets_K[None], temperature, chunk)
  return logp[0]


def _bucket(n: int, chunk: int) -> int:
  """A padded length: a power of two, a multiple of `chunk` (few shapes, few compiles)."""
  return max(chunk, 1 << math.ceil(math.log2(max(n, 1))))


def tree_logprobs(model, tree: CallTree, cfg: LearnerConfig) -> tuple[np.ndarray, np.ndarray]:
  """(loss token indices into the tree, their log-prob under `model`) for one kept rollout tree."""
  loss = np.flatnonzero(tree.owner_T >= 0)
  size = _bucket(tree.size, 1)
  chunk = min(cfg.logits_chunk, _bucket(len(loss), 1))
  k = -(-_bucket(len(loss), 1) // chunk) * chunk
  pad = lambda a, fill: np.concatenate([a, np.full(size - len(a), fill, np.int32)]).astype(np.int32)
  segment = pad(np.ones(tree.size, np.int32), 0)
  subtree_end = np.concatenate([tree.subtree_end_T, np.arange(tree.size, size) + 1]).astype(np.int32)
  pred = np.zeros(k, np.int32)
  pred[:len(loss)] = tree.parent_T[loss]
  targets = np.zeros(k, np.int32)
  targets[:len(loss)] = tree.tokens_T[loss]
  logp = _tree_logprobs(model, jnp.asarray(pad(tree.tokens_T, 0)), jnp.asarray(pad(tree.depth_T, 0)),
                        jnp.asarray(segment), jnp.asarray(subtree_end), jnp.asarray(pred), jnp.asarray(targets),
                        temperature=cfg.temperature, chunk=chunk)
  return loss, np.asarray(logp)[:len(loss)]


def write_learner_view(path: pathlib.Path, model, rewards: Mapping[str, float], calls_dir: pathlib.Path,
                       learner: LearnerConfig, filters: FilterConfig) -> dict[str, list[list[float]]]:
  """Writes LEARNER_FILE at `path` for the best and worst SHOWN rollouts of `rewards` whose calls are in
  `calls_dir`; returns its rollouts' rows."""
  ranked = sorted(rewards, key=lambda rid: (-rewards[rid], rid))
  chosen = list(dict.fromkeys(ranked[:SHOWN] + ranked[::-1][:SHOWN]))
  files = [p for rid in chosen if (p := calls_dir / f"{rid}.jsonl").is_file()]
  log = load(files, errors="collect") if files else None
  out: dict[str, list[list[float]]] = {}
  for rid in chosen:
    if log is None or rid not in log.calls:
      continue
    tree = filter_rollout(rid, log.calls[rid], filters).tree
    if not tree.size:
      continue
    idx, logp = tree_logprobs(model, tree, learner)
    ratio = np.exp(logp - tree.logprobs_T[idx])
    out[rid] = [[int(tree.owner_T[i]), int(tree.depth_T[i]), round(float(lp), 6),
                 round(float(min(r, learner.c_bar)), 6), int(r > learner.c_bar)] for i, lp, r in zip(idx, logp, ratio)]
  path.write_text(json.dumps({"c_bar": learner.c_bar, "rollouts": out}) + "\n")
  return out
