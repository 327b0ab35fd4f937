"""SFT throughput: packed rows (several conversations a row, length-binned) against one conversation a row.

Data: a length-skewed set of conversation trees (lognormal lengths, median `--median-len`, capped at
`--row-len`: most conversations short, a few near the limit, as agent trajectories are), random token ids,
the assistant turns (3 turns, a twelfth of the length each) trained. Both layouts train the same
epoch of the same trees with the SFT stage's learner step (`sft` loss, blocked attention that skips key
blocks no query sees, so a padded row costs less than a full one), in batches of `--rows` rows of
`--row-len` tokens: the packed layout as the stage plans it (clawjax.sft.packing), the other with one
conversation a row. Each layout runs its whole epoch after one compile step; tokens/s counts the
conversations' tokens (not padding) per second of learner steps.

Prints padding_fraction, batches, step_s and tokens_per_s per layout, and speedup (packed / unpacked
tokens per second; the goal is >= 3). `--json` prints one JSON object.

  python benchmarks/sft_throughput.py [--json] [--conversations 256] [--row-len 4096] [--rows 8] ...
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np
from flax import nnx

from clawjax.calllog import CallRecord
from clawjax.environment import describe as describe_environment
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.sft.packing import BatchPlan, pack, padding_fraction, plan_epoch
from clawjax.sft.render import conversation_tree


def conversations(args) -> list:
  """Trees of lognormal lengths: a prompt, then 3 turns of (assistant output, tool result), outputs a
  twelfth of the length each."""
  rng = np.random.default_rng(args.seed)
  lengths = np.clip(rng.lognormal(np.log(args.median_len), args.sigma, args.conversations), 32, args.row_len)
  trees = []
  for i, n in enumerate(lengths.astype(int)):
    ids = tuple(rng.integers(1, args.vocab, n).tolist())
    q = n // 12
    prompt = n - 6 * q
    calls = [CallRecord(f"c{i}", "bench", "sft", k, "ok", ids[:prompt + 2 * k * q],
                        ids[prompt + 2 * k * q:prompt + (2 * k + 1) * q], (0.0,) * q, "main", "stop", "", 0.0, 0.0)
             for k in range(3)]
    trees.append(conversation_tree(f"c{i}", calls, args.row_len, "drop")[0])
  return trees


def run_layout(trees, plans: list[BatchPlan], args) -> dict:
  cfg = preset(args.preset, attention_impl="blocked", attention_block=args.attention_block)
  cfg = cfg.replace(vocab_size=args.vocab, n_layers=args.layers, d_model=args.d_model, mlp_dim=4 * args.d_model,
                    n_heads=args.d_model // 64, n_kv_heads=max(args.d_model // 128, 1), head_dim=64)
  learner = Learner(LearnerConfig(loss="sft", lr=1e-4, logits_chunk=args.logits_chunk),
                    Decoder(cfg, rngs=nnx.Rngs(args.seed)))
  batches = [pack(trees, p, row_len=args.row_len, rows=range(args.rows)) for p in plans]
  learner.step(batches[0])  # compile (shapes are the same for every batch of both layouts)
  times, tokens = [], 0
  for b in batches:
    start = time.perf_counter()
    m = learner.step(b)
    times.append(time.perf_counter() - start)
    tokens += int(m["tokens"])
  return {"batches": len(batches), "tokens": tokens,
          "padding_fraction": round(float(np.mean([padding_fraction(b) for b in batches])), 4),
          "step_s": round(statistics.median(times), 4), "tokens_per_s": round(tokens / sum(times), 1)}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--json", action="store_true")
  p.add_argument("--conversations", type=int, default=256)
  p.add_argument("--median-len", type=int, default=400)
  p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the lengths (the skew)")
  p.add_argument("--row-len", type=int, default=4096)
  p.add_argument("--rows", type=int, default=8)
  p.add_argument("--pool-batches", type=int, default=8)
  p.add_argument("--preset", default="test-tiny", help="the architecture family (Qwen3); sizes from the flags")
  p.add_argument("--vocab", type=int, default=4096, help="vocabulary size of the model (ids are drawn below it)")
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--d-model", type=int, default=256, help="width (heads of 64, MLP 4x): per-token work that "
                 "padding costs as much as a token, as in real models")
  p.add_argument("--attention-block", type=int, default=256)
  p.add_argument("--logits-chunk", type=int, default=256)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  trees = conversations(args)
  sizes = [t.size for t in trees]
  packed_plans = plan_epoch(sizes, row_len=args.row_len, rows=args.rows, pool_batches=args.pool_batches,
                            seed=args.seed, epoch=0)
  order = np.random.default_rng(args.seed).permutation(len(trees)).tolist()
  unpacked_plans = [BatchPlan(tuple(order[k:k + args.rows]), tuple(range(len(order[k:k + args.rows]))))
                    for k in range(0, len(order), args.rows)]
  out = {"benchmark": "sft_throughput", "conversations": len(trees), "mean_len": round(float(np.mean(sizes)), 1),
         "max_len": int(max(sizes)), "row_len": args.row_len, "rows": args.rows, "preset": args.preset,
         "d_model": args.d_model, "layers": args.layers, "vocab": args.vocab, "packed": run_layout(trees, packed_plans, args),
         "unpacked": run_layout(trees, unpacked_plans, args)}
  out["speedup"] = round(out["packed"]["tokens_per_s"] / out["unpacked"]["tokens_per_s"], 2)
  out["environment"] = {"machine": platform.machine(), "jax": describe_environment()["jax"]}
  if args.json:
    print(json.dumps(out))
  else:
    for name in ("packed", "unpacked"):
      print(f"{name:9s} {out[name]}")
    print(f"speedup {out['speedup']}x (conversations {out['conversations']}, mean {out['mean_len']} tokens, "
          f"rows of {args.row_len})")
  return out


if __name__ == "__main__":
  main()
