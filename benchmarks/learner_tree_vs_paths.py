"""Learner step time on the tree layout vs the paths layout, on agent-shaped GRPO groups.

Data: `clawjax.tree.synthetic.agent_group` (one GRPO group of rollouts sharing the task prompt; each a
tool loop of `--calls` calls whose history grows by `--tokens-per-call` tokens from a `--prompt-len`
prompt; Qwen3-style thinking that the harness strips from the history, so every call's sampled output
is its own branch), filtered and packed by clawjax.tree. Both layouts train the same loss tokens with the
same weights on the same model; the rows of the paths layout are fed as micro-batches of the tree
layout's row count, so both jitted steps see [rows, row_len] micro-batches and memory stays bounded.

Prints ideal_ratio (paths tokens / tree tokens), the median step time of each layout (measured side by
side, after compiling), speedup (paths / tree step time) and max_rel_loss_diff / max_rel_grad_diff of
loss and gradients (same params, both normalisations).

Tokens are not the whole cost: a token also attends to each of its ancestors, and a tree token sits as
deep as it does in any path, so attention work shrinks less than the token count (`attention_ratio`).
How much that matters depends on the model's width: `flop_ratio` is the paths/tree ratio of the step's
FLOPs for the chosen model (per-token projections and MLP + per-ancestor attention + the vocabulary
projection at loss tokens, which the paths layout repeats on every path), the speedup a perfect kernel
would reach; `tree_attention_flop_share` / `tree_logits_flop_share` say what the tree step is bound by.
test-tiny (d_model 64) is almost all attention at these lengths; the real models' layers are not
(Qwen3-30B-A3B spends as much on a token's layers as on attending to ~7K ancestors).

  python benchmarks/learner_tree_vs_paths.py [--json] [--preset test-tiny --layers 0] [--rollouts 8] ...
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import numpy as np
from flax import nnx

from clawjax.aot.flops import forward_flops
from clawjax.environment import describe as describe_environment
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_paths, pack_trees


def make_batches(args) -> tuple:
  rng = np.random.default_rng(args.seed)
  calls, outcomes = synthetic.agent_group(
      rng, task_id="bench", n_rollouts=args.rollouts, prompt_len=args.prompt_len, n_calls=args.calls,
      tokens_per_call=args.tokens_per_call, patterns=("thinking_stripped",), vocab_size=args.vocab)
  by_rollout: dict[str, list] = {}
  for c in calls:
    by_rollout.setdefault(c.rollout_id, []).append(c)
  trees = [filter_rollout(rid, cs).tree for rid, cs in by_rollout.items()]
  scores = grpo_advantages(outcomes)
  row_len = args.row_len or -(-max(t.size for t in trees) // args.attention_block) * args.attention_block
  tree = pack_trees(trees, scores, row_len=row_len, share_prompts=args.share_prompts)
  paths = pack_paths(trees, scores, row_len=row_len)
  return tree, paths, sum(len(cs) for cs in by_rollout.values())


def attended_pairs(batch) -> float:
  """Query-key pairs the mask allows: each token sees its depth + 1 ancestors-or-self."""
  return float(np.sum(np.where(batch.segment_ids_RT > 0, batch.positions_RT + 1.0, 0.0)))


def rel(a, b) -> float:
  la = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(a))]
  lb = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(b))]
  return max(float(np.max(np.abs(x - y))) for x, y in zip(la, lb)) / max(float(np.max(np.abs(y))) for y in lb)


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--rollouts", type=int, default=2, help="rollouts in the GRPO group (8: ~4x the time)")
  p.add_argument("--prompt-len", type=int, default=1000, help="task prompt tokens (system, tools, task)")
  p.add_argument("--calls", type=int, default=30, help="main calls per rollout")
  p.add_argument("--tokens-per-call", type=int, default=100, help="history growth per call")
  p.add_argument("--preset", default="smollm2-135m", help="model preset (clawjax.models.config.PRESETS): "
                 "a real model's layer shapes, so attention weighs what it does in real training")
  p.add_argument("--layers", type=int, default=1, help="override the preset's layer count (the "
                 "speedup does not depend on it; the run time does; 0: the preset's)")
  p.add_argument("--vocab", type=int, default=8192,
                 help="vocab size of model and data (the projection cost is the same in both layouts)")
  p.add_argument("--attention-block", type=int, default=512)
  p.add_argument("--logits-chunk", type=int, default=128,
                 help="LearnerConfig.logits_chunk: loss slots per row are padded to a multiple of it, which "
                      "costs the paths layout (many rows, few loss tokens each) more than the tree layout")
  p.add_argument("--repeats", type=int, default=2, help="timed steps per layout (median reported)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--row-len", type=int, default=0, help="packed row length (0: the longest tree rounded up "
                 "to --attention-block, which leaves no room to merge a group's trees)")
  p.add_argument("--share-prompts", action="store_true",
                 help="tree layout stores the group's common task prompt once (pack_trees share_prompts)")
  args = p.parse_args(argv)

  tree, paths, n_calls = make_batches(args)
  overrides = {"n_layers": args.layers} if args.layers else {}
  model_cfg = preset(args.preset, vocab_size=args.vocab, attention_impl="blocked",
                     attention_block=args.attention_block, **overrides)
  tree_rows = tree.shape[0]
  paths_micro = -(-paths.shape[0] // tree_rows)
  out = {"device": jax.devices()[0].device_kind, "n_devices": jax.device_count(), "host": platform.node(),
         "preset": args.preset, "layers": model_cfg.n_layers, "d_model": model_cfg.d_model, "vocab": args.vocab, "rollouts": args.rollouts, "calls": n_calls,
         "row_len": tree.shape[1], "tree_rows": tree_rows, "paths_rows": paths.shape[0],
         "tree_tokens": int((tree.segment_ids_RT > 0).sum()), "paths_tokens": int((paths.segment_ids_RT > 0).sum()),
         "loss_tokens": int((tree.unique_weight_RT > 0).sum())}
  out["ideal_ratio"] = round(out["paths_tokens"] / out["tree_tokens"], 3)
  out["attention_ratio"] = round(attended_pairs(paths) / attended_pairs(tree), 3)
  # Timed steps use path weighting (the last normalisation below): logits at every trained token of
  # every path in the paths layout, at each trained token once in the tree layout.
  flops = {name: forward_flops(model_cfg, tokens=out[name + "_tokens"], attended_pairs=attended_pairs(b),
                               logit_tokens=float((b.path_weight_RT > 0).sum()))
           for name, b in (("tree", tree), ("paths", paths))}
  out["flop_ratio"] = round(sum(flops["paths"]) / sum(flops["tree"]), 3)
  out["tree_attention_flop_share"] = round(flops["tree"][1] / sum(flops["tree"]), 3)
  out["tree_logits_flop_share"] = round(flops["tree"][2] / sum(flops["tree"]), 3)

  diffs_loss, diffs_grad = [], []
  for norm in ("unique", "paths"):
    learners = [Learner(LearnerConfig(normalisation=norm, micro_batches=m, lr=1e-4,
                                      logits_chunk=args.logits_chunk),
                        Decoder(model_cfg, rngs=nnx.Rngs(0))) for m in (1, paths_micro)]
    (lt, gt, _), (lp, gp, _) = learners[0].loss_and_grads(tree), learners[1].loss_and_grads(paths)
    diffs_loss.append(abs(lt - lp) / max(abs(lp), 1e-30))
    diffs_grad.append(rel(gt, gp))
  out["max_rel_loss_diff"], out["max_rel_grad_diff"] = max(diffs_loss), max(diffs_grad)

  times = {}
  for name, batch, learner in (("tree", tree, learners[0]), ("paths", paths, learners[1])):
    device_batch = learner.prepare(batch)
    start = time.perf_counter()
    learner.step(device_batch)
    times[name + "_compile_and_first_step_s"] = round(time.perf_counter() - start, 2)
    times[name] = []
  for _ in range(args.repeats):  # interleaved, so background load hits both layouts alike
    for name, batch, learner in (("tree", tree, learners[0]), ("paths", paths, learners[1])):
      times[name].append(learner.step(learner.prepare(batch))["step_seconds"])
  for name in ("tree", "paths"):
    out[name + "_step_s"] = round(statistics.median(times.pop(name)), 3)
  out.update(times)
  out["speedup"] = round(out["paths_step_s"] / out["tree_step_s"], 2)
  out["speedup_over_ideal"] = round(out["speedup"] / out["ideal_ratio"], 3)
  out["speedup_over_flop_ratio"] = round(out["speedup"] / out["flop_ratio"], 3)
  out["environment"] = describe_environment()
  if args.json:
    print(json.dumps(out))
  else:
    for k, v in out.items():
      print(f"{k:>34}: {v}")
  return out


if __name__ == "__main__":
  main()
