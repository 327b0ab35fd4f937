"""Learner step time of each registered policy loss, side by side in one process, on the quickstart's shapes.

Data: `clawjax.tree.synthetic.agent_group` groups shaped like the CPU quickstart's (a ~450-token task
prompt, two short tool calls a rollout, 8 rollouts a group), packed as a training step packs them (shared
prompts, `--row-len` rows). Model: the quickstart's toy Llama (SmolLM2's 49K vocabulary at d_model 64, two
layers). One Learner per loss on the same batch and initial weights; after a compiling step each, the
timed steps go round the losses in turn, each round starting one loss later (grpo gspo cispo, gspo cispo
grpo, ...), so that background load and a position's effect hit them alike; the median of each, its
ratio to grpo's, and the median of each round's ratio to grpo's step are printed. A step is `Learner.step`: the pi_old
pass, the loss and its gradient, the optimizer update.

  python benchmarks/loss_step.py [--json] [--repeats 7] [--losses grpo gspo cispo]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jax
import numpy as np
from flax import nnx

from clawjax.environment import describe as describe_environment
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees

# configs/quickstart.py's model.
QUICKSTART_MODEL = dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=256)


def make_batch(args):
  rng = np.random.default_rng(args.seed)
  calls, outcomes = [], []
  for g in range(args.groups):
    c, o = synthetic.agent_group(rng, task_id=f"task{g}", n_rollouts=args.rollouts, prompt_len=args.prompt_len,
                                 n_calls=args.calls, tokens_per_call=args.tokens_per_call, vocab_size=args.vocab)
    calls += c
    outcomes += o
  ids = list(dict.fromkeys(c.rollout_id for c in calls))
  trees = [filter_rollout(rid, [c for c in calls if c.rollout_id == rid]).tree for rid in ids]
  return pack_trees(trees, grpo_advantages(outcomes), row_len=args.row_len, share_prompts=True)


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--losses", nargs="+", default=["grpo", "gspo", "cispo"], help="the first is the reference")
  p.add_argument("--groups", type=int, default=4, help="GRPO groups (the quickstart: 4 tasks a step)")
  p.add_argument("--rollouts", type=int, default=8, help="rollouts a group")
  p.add_argument("--prompt-len", type=int, default=400)
  p.add_argument("--calls", type=int, default=2)
  p.add_argument("--tokens-per-call", type=int, default=40)
  p.add_argument("--row-len", type=int, default=640, help="packed row length (the quickstart's batch.row_len)")
  p.add_argument("--vocab", type=int, default=49_152)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--logits-chunk", type=int, default=128)
  p.add_argument("--repeats", type=int, default=7, help="timed steps per loss (median reported)")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)

  batch = make_batch(args)
  model_cfg = preset("smollm2-135m", vocab_size=args.vocab, **dict(QUICKSTART_MODEL, n_layers=args.layers))
  learners = {loss: Learner(LearnerConfig(loss=loss, lr=1e-3, logits_chunk=args.logits_chunk),
                            Decoder(model_cfg, rngs=nnx.Rngs(0))) for loss in args.losses}
  prepared = {loss: learner.prepare(batch) for loss, learner in learners.items()}
  out = {"device": jax.devices()[0].device_kind, "rows": batch.shape[0], "row_len": batch.shape[1],
         "tokens": int((batch.segment_ids_RT > 0).sum()), "loss_tokens": int(batch.loss_mask_RT().sum()),
         "vocab": args.vocab, "layers": args.layers, "repeats": args.repeats, "load_before": os.getloadavg()}
  first = {}
  for loss, learner in learners.items():
    start = time.perf_counter()
    learner.step(prepared[loss])
    first[loss] = round(time.perf_counter() - start, 2)
  times: dict[str, list[float]] = {loss: [] for loss in learners}
  for k in range(args.repeats):
    for loss in args.losses[k % len(args.losses):] + args.losses[:k % len(args.losses)]:
      times[loss].append(learners[loss].step(prepared[loss])["step_seconds"])
  reference = args.losses[0]
  median = {loss: statistics.median(t) for loss, t in times.items()}
  out["compile_and_first_step_s"] = first
  out["step_s"] = {loss: round(m, 4) for loss, m in median.items()}
  out["ratio_to_" + reference] = {loss: round(m / median[reference], 3) for loss, m in median.items()}
  # Each step's ratio to the reference step beside it in the same round: robust to slow load drifts.
  out["paired_ratio_to_" + reference] = {
      loss: round(statistics.median(a / b for a, b in zip(t, times[reference])), 3) for loss, t in times.items()}
  out["load_after"] = os.getloadavg()
  out["environment"] = describe_environment()
  if args.json:
    print(json.dumps(out))
  else:
    for k, v in out.items():
      print(f"{k:>28}: {v}")
  return out


if __name__ == "__main__":
  main()
