"""Build + pack throughput of the tree stage on agent-shaped synthetic rollouts, at sizes N and 2N.

Each rollout: 32 main calls (plus pattern calls), a long prompt and short turns, so that ~99% of each
input repeats the previous call; at 2N the prompt and the turns are twice as long (contexts up to
~60K tokens). Linear building shows a 2N / N time ratio near 2 (a quadratic scan would show ~4).

  python benchmarks/tree_build.py [--json] [--rollouts 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from clawjax.calllog import RolloutRecord
from clawjax.environment import describe as describe_environment
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees
from clawjax.tree.summary import summarize

PATTERNS = ("retry", "error", "subagent", "parallel_tools", "reserialised")


def measure(scale: int, n_rollouts: int, repeats: int) -> dict:
  rng = np.random.default_rng(scale)
  prompt = synthetic.task_prompt(rng, 20000 * scale, vocab_size=151643)
  rollouts = [synthetic.agent_rollout(rng, rollout_id=f"r{i}", task_id="t", harness="h",
                                      prompt_ids=prompt, n_calls=32, tokens_per_call=300 * scale,
                                      patterns=PATTERNS, vocab_size=151643)
              for i in range(n_rollouts)]
  scores = grpo_advantages([RolloutRecord(f"r{i}", "t", "h", float(i % 2), "ok")
                            for i in range(n_rollouts)])
  tokens_read = sum(len(c.input_ids) + len(c.output_ids) for calls in rollouts for c in calls)
  best_build = best_pack = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    filtered = [filter_rollout(calls[0].rollout_id, calls) for calls in rollouts]
    t1 = time.perf_counter()
    trees = [f.tree for f in filtered]
    pack_trees(trees, scores, row_len=max(t.size for t in trees))
    t2 = time.perf_counter()
    best_build, best_pack = min(best_build, t1 - t0), min(best_pack, t2 - t1)
  stats = [summarize(f) for f in filtered]
  call_tokens = sum(s["call_tokens"] for s in stats)
  unique = sum(s["unique_tokens"] for s in stats)
  total = best_build + best_pack
  return {
      "rollouts": n_rollouts, "calls": sum(map(len, rollouts)), "tokens_read": tokens_read,
      "max_context": max(len(c.input_ids) + len(c.output_ids) for calls in rollouts for c in calls),
      "build_s": round(best_build, 4), "pack_s": round(best_pack, 4), "total_s": round(total, 4),
      "tokens_read_per_s": round(tokens_read / total), "call_tokens": call_tokens,
      "unique_tokens": unique, "path_tokens": sum(s["path_tokens"] for s in stats),
      "call_tokens_over_unique_tokens": round(call_tokens / unique, 2),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument("--rollouts", type=int, default=8, help="rollouts per size (default 8)")
  parser.add_argument("--repeats", type=int, default=3, help="timing repeats; the best counts")
  args = parser.parse_args()
  n, n2 = (measure(s, args.rollouts, args.repeats) for s in (1, 2))
  result = {"N": n, "2N": n2, "tokens_ratio": round(n2["tokens_read"] / n["tokens_read"], 3),
            "time_ratio": round(n2["total_s"] / n["total_s"], 3), "environment": describe_environment()}
  if args.json:
    print(json.dumps(result))
    return
  for name in ("N", "2N"):
    r = result[name]
    print(f"{name:>2}: {r['tokens_read']:>10,} tokens read (max context {r['max_context']:,}) in "
          f"{r['total_s']:.3f} s (build {r['build_s']:.3f}, pack {r['pack_s']:.3f}): "
          f"{r['tokens_read_per_s']:,} tok/s; call/unique tokens {r['call_tokens_over_unique_tokens']}")
  print(f"time ratio 2N/N {result['time_ratio']} for tokens ratio {result['tokens_ratio']}")


if __name__ == "__main__":
  main()
