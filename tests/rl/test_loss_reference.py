"""Every registered policy loss and every aggregation against an independent per-path float64 reference.

The learner trains on tree-packed batches (clawjax.tree.pack: prompts shared within a group, several
rollouts a row, an empty row of padding) of synthetic harness calls whose trees branch and whose sampled
turns lie on two kept paths. The reference reads the same trees as an unpacked implementation would:
each kept root-to-leaf path a plain causal sequence of its own (its paths enumerated here from the parent
arrays), the policy run on each path alone; the loss, the aggregation and the loss's derivative with
respect to every path token's log-prob are written out in float64 numpy, and the parameter gradient is
that derivative pulled back through the per-path forward (jax.vjp). pi_old comes from a perturbed copy
of the policy, so that ratios move off 1 and every clip binds somewhere; the rollout log-probs sit near
pi_old with noise, so that the TIS weight varies and truncates.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.rl.loss_check import example_batch, example_trees, tiny_policy, with_logprobs
from tests.rl.learner_batches import Tree, rel_diff

TOL = 1e-5
C_BAR = 1.3
L_CONST = 96  # aggregation_tokens of the "constant" cases


@dataclasses.dataclass
class PathData:
  """The trained token occurrences of every kept path (one entry per path and token), and what the
  per-path forward needs to pull a derivative back to the parameters."""
  rollout: np.ndarray      # the occurrence's rollout (tree) index
  first: np.ndarray        # 1 at the first occurrence of its token among its rollout's paths (unique weight)
  lp: np.ndarray           # log pi_theta, float64 from the path's own forward
  lpo: np.ndarray          # log pi_old, the same from the perturbed policy
  lpr: np.ndarray          # the rollout log-prob packed with the tree
  advantage: np.ndarray
  reward: np.ndarray
  baseline: np.ndarray
  where: tuple[np.ndarray, np.ndarray]  # (path, position - 1): the occurrence in the [paths, T - 1] log-probs
  shape: tuple[int, int]   # [paths, T - 1]
  vjp: object              # cotangent [paths, T - 1] -> parameter gradient
  batch: object            # the tree-packed PackedBatch

  def cotangent(self, per_occurrence: np.ndarray) -> np.ndarray:
    out = np.zeros(self.shape)
    np.add.at(out, self.where, per_occurrence)
    return out


def _paths(trees) -> list[tuple[int, list[int]]]:
  return [(i, path) for i, t in enumerate(trees)
          for path in Tree(t.parent_T, t.tokens_T, t.owner_T >= 0, t.logprobs_T, 0.0, 0.0).paths()]


def _path_forward(policy, paths, trees):
  """log pi(token_j | path_<j) of every path run alone, [paths, T - 1] (float32), as a function of the
  policy's parameters; and float64 log-probs from its logits."""
  length = max(len(p) for _, p in paths)
  tokens = np.zeros((len(paths), length), np.int32)
  seg = np.zeros_like(tokens)
  end = np.tile(np.arange(1, length + 1, dtype=np.int32), (len(paths), 1))
  for k, (i, path) in enumerate(paths):
    tokens[k, :len(path)] = trees[i].tokens_T[path]
    seg[k, :len(path)] = 1
    end[k, :len(path)] = len(path)
  positions = np.tile(np.arange(length, dtype=np.int32), (len(paths), 1))
  graph, params, rest = nnx.split(policy, nnx.Param, ...)
  inputs = [jnp.asarray(a) for a in (tokens, positions, seg, end)]

  def logp_of(params):
    logits = nnx.merge(graph, params, rest)(*inputs).astype(jnp.float32)
    return jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], -1), inputs[0][:, 1:, None], -1)[..., 0]

  logits = np.asarray(nnx.merge(graph, params, rest)(*inputs), np.float64)[:, :-1]
  logits -= logits.max(-1, keepdims=True)
  lp64 = np.take_along_axis(logits, tokens[:, 1:, None], -1)[..., 0] - np.log(np.exp(logits).sum(-1))
  _, vjp = jax.vjp(logp_of, params)
  return lp64, vjp


def _perturbed(policy, scale: float, seed: int):
  graph, params, rest = nnx.split(policy, nnx.Param, ...)
  keys = iter(jax.random.split(jax.random.PRNGKey(seed), len(jax.tree.leaves(params))))
  noisy = jax.tree.map(lambda a: a + scale * jax.random.normal(next(keys), a.shape, a.dtype), params)
  return nnx.merge(graph, noisy, rest)


def _path_data(patterns: tuple[str, ...] | None = None, rollout_noise: float = 0.3):
  """(PathData, the policy, the perturbed pi_old policy)."""
  trees, scores = example_trees(0) if patterns is None else example_trees(0, patterns=patterns)
  policy, old = tiny_policy(0), _perturbed(tiny_policy(0), 0.03, 1)
  paths = _paths(trees)
  lp_old, _ = _path_forward(old, paths, trees)
  # The rollout log-probs: pi_old's with noise, on each tree node (a node's log-prob is the same on each path).
  rng = np.random.default_rng(2)
  node_lpo = [np.zeros(t.size) for t in trees]
  for k, (i, path) in enumerate(paths):
    node_lpo[i][path[1:]] = lp_old[k, :len(path) - 1]
  trees = [with_logprobs(t, node_lpo[i] + rollout_noise * rng.normal(size=t.size)) for i, t in enumerate(trees)]
  lp, vjp = _path_forward(policy, paths, trees)
  index = scores.index()
  fields = {k: [] for k in ("rollout", "first", "lp", "lpo", "lpr", "advantage", "reward", "baseline", "p", "j")}
  seen = [np.zeros(t.size, bool) for t in trees]
  for k, (i, path) in enumerate(paths):
    t, n = trees[i], index[trees[i].rollout_id]
    for j in range(1, len(path)):
      node = path[j]
      if t.owner_T[node] < 0:
        continue
      for name, v in (("rollout", i), ("first", not seen[i][node]), ("lp", lp[k, j - 1]), ("lpo", lp_old[k, j - 1]),
                      ("lpr", t.logprobs_T[node]), ("advantage", scores.advantages_N[n]),
                      ("reward", scores.rewards_N[n]), ("baseline", scores.baselines_N[n]), ("p", k), ("j", j - 1)):
        fields[name].append(v)
      seen[i][node] = True
  a = {k: np.asarray(v, np.float64 if k not in ("rollout", "p", "j") else np.int64) for k, v in fields.items()}
  return PathData(a["rollout"], a["first"], a["lp"], a["lpo"], a["lpr"], a["advantage"], a["reward"], a["baseline"],
                  (a["p"], a["j"]), lp.shape, vjp, example_batch(trees=trees, scores=scores)), policy, old


def _per_rollout_mean(d: PathData, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
  n = d.rollout.max() + 1
  return (np.bincount(d.rollout, weight * x, n) / np.bincount(d.rollout, weight, n))[d.rollout]


def reference(d: PathData, loss: str, opt: dict, aggregation: str) -> tuple[float, float, np.ndarray]:
  """(loss, its magnitude sum |a w term| / N, d loss / d log pi of each occurrence), float64."""
  adv = d.advantage if opt.get("advantage_std", True) else d.reward - d.baseline
  w = np.minimum(np.exp(d.lpo - d.lpr), C_BAR)
  r = np.exp(d.lp - d.lpo)
  if loss == "grpo":
    clipped, unclipped = np.clip(r, 0.8, 1.28) * adv, r * adv
    term, dterm = -np.minimum(clipped, unclipped), np.where(clipped < unclipped, 0.0, -r * adv)
  elif loss == "cispo":
    c = np.clip(r, 1 - opt.get("eps_low", 1.0), 1 + opt.get("eps_high", 0.28))
    term, dterm = -c * adv * d.lp, -c * adv
  else:  # gspo: the sequence ratio of each rollout over its unique tokens, or every path's tokens
    omega = d.first if opt.get("weight", "unique") == "unique" else np.ones_like(d.first)
    s = np.exp(_per_rollout_mean(d, d.lp - d.lpo, omega))
    clipped, unclipped = np.clip(s, 1 - opt.get("eps_low", 3e-4), 1 + opt.get("eps_high", 4e-4)) * adv, s * adv
    term, dterm = -np.minimum(clipped, unclipped), np.where(clipped < unclipped, 0.0, -s * adv)
    if opt.get("tis") == "sequence":
      w = np.minimum(np.exp(_per_rollout_mean(d, d.lpo - d.lpr, omega)), C_BAR)
  rollouts = len(np.unique(d.rollout))
  tokens = np.bincount(d.rollout, d.first)[d.rollout]
  a, norm = {"token": (d.first, d.first.sum()), "paths": (np.ones_like(d.first), len(d.first)),
             "rollout": (d.first / tokens, rollouts), "constant": (d.first / L_CONST, rollouts)}[aggregation]
  return float(np.sum(a * w * term) / norm), float(np.sum(a * w * np.abs(term)) / norm), a * w * dterm / norm


@pytest.fixture(scope="module")
def data():
  return _path_data()


CASES = [("grpo", {}, "token"), ("grpo", {}, "paths"), ("grpo", {}, "rollout"),
         ("grpo", {"advantage_std": False}, "constant"), ("cispo", {}, "token"),
         ("cispo", {"eps_low": 0.2, "eps_high": 0.1}, "rollout"), ("gspo", {"eps_low": 0.02, "eps_high": 0.03}, "rollout"),
         ("gspo", {"weight": "paths", "tis": "sequence"}, "token")]


@pytest.mark.parametrize("loss,opt,aggregation", CASES, ids=[f"{l}-{a}-{'-'.join(o)}" for l, o, a in CASES])
def test_loss_and_gradient_equal_the_per_path_float64_reference(data, loss, opt, aggregation):
  d, policy, old_policy = data
  assert d.batch.path_weight_RT.max() == 2 and (d.batch.segment_ids_RT.max(axis=1) == 0).sum() == 1
  assert max(len(np.unique(r[r >= 0])) for r in d.batch.rollout_index_RT) >= 3  # several rollouts a row
  cfg = LearnerConfig(loss=loss, loss_kwargs=opt, aggregation=aggregation, aggregation_tokens=L_CONST,
                      c_bar=C_BAR, logits_chunk=64)
  learner, old_learner = Learner(cfg, policy), Learner(LearnerConfig(logits_chunk=64), old_policy)
  batch = learner.prepare(d.batch)
  got, grads, metrics = learner.loss_and_grads(batch, old_learner.old_pass(batch))
  want, magnitude, dloss = reference(d, loss, opt, aggregation)
  assert abs(got - want) <= TOL * magnitude, (got, want)
  (want_grads,) = d.vjp(jnp.asarray(d.cotangent(dloss), jnp.float32))
  assert rel_diff(grads["policy"], want_grads) < TOL
  assert 0.05 < metrics["tis_truncated_fraction"] < 0.95
  if "clip_fraction" in metrics:
    assert 0 < metrics["clip_fraction"] < 1  # the clip binds on some tokens, not all


def test_gspo_on_one_path_rollouts_is_the_published_sequence_formula():
  """Rollouts without branches (each tree one path) and rollout log-probs equal to pi_old's (no TIS
  correction): gspo with its own aggregation is GSPO's objective (arXiv 2507.18071, Eq. 5-7),
      J = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i),
      s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|),
  whose gradient is 1/G sum_i s_i A_i / |y_i| sum_t grad log pi_theta(y_i,t) where s_i is not clipped."""
  d, policy, old_policy = _path_data(patterns=(), rollout_noise=0.0)
  sequences = d.where[0].max() + 1
  assert sequences == len(np.unique(d.rollout)) and d.first.all()  # one path a rollout
  learner = Learner(LearnerConfig(loss="gspo", logits_chunk=64), policy)  # the paper's eps: 3e-4, 4e-4
  batch = learner.prepare(d.batch)
  got, grads, _ = learner.loss_and_grads(batch, Learner(LearnerConfig(logits_chunk=64), old_policy).old_pass(batch))

  length = np.bincount(d.rollout)
  s = np.exp(np.bincount(d.rollout, d.lp - d.lpo) / length)
  adv = np.array([d.advantage[d.rollout == i][0] for i in range(len(length))])
  clipped = np.clip(s, 1 - 3e-4, 1 + 4e-4) * adv
  objective = np.mean(np.minimum(s * adv, clipped))
  live = s * adv <= clipped  # where the min takes the unclipped term, s_i carries the gradient
  assert 0 < live.sum() < len(live)
  assert abs(got + objective) <= TOL * np.mean(np.abs(s * adv))
  dloss = -(np.where(live, s * adv, 0.0) / length / len(length))[d.rollout]
  (want_grads,) = d.vjp(jnp.asarray(d.cotangent(dloss), jnp.float32))
  assert rel_diff(grads["policy"], want_grads) < TOL
