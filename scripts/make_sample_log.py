"""Regenerates clawjax/data/sample_calls.jsonl, the bundled call log that README command one summarises.

Synthetic rollouts (clawjax.tree.synthetic) covering what the tree stage handles: a plain tool loop, a
retry after a malformed call and a failed (HTTP 500) call, compaction, a subagent and an auxiliary side
call, role-less calls (structural inference), thinking stripped from history (drift), OpenClaw's
moving context message, and one over-branching rollout; with rollout records (rewards) for two tasks under two harnesses.

Usage: python scripts/make_sample_log.py [OUT]   (deterministic: same file every run)
"""

import os
import pathlib
import sys

import numpy as np

from clawjax.calllog import CallLogWriter, RolloutRecord
from clawjax.tree import synthetic

OUT = pathlib.Path(__file__).resolve().parent.parent / "clawjax" / "data" / "sample_calls.jsonl"

# (rollout suffix, task, harness, reward, agent_rollout arguments)
ROLLOUTS = [
    ("linear", "fix-csv", "claude_code", 1.0, dict(n_calls=5)),
    ("retry-error", "fix-csv", "claude_code", 0.0, dict(n_calls=5, patterns=("retry", "error"))),
    ("compaction", "fix-csv", "claude_code", 0.75, dict(n_calls=6, patterns=("compaction",))),
    ("subagent", "fix-csv", "openclaw", 1.0,
     dict(n_calls=5, patterns=("subagent", "auxiliary", "parallel_tools"))),
    ("no-roles", "fix-csv", "openclaw", 0.5,
     dict(n_calls=5, patterns=("subagent", "retry"), label_roles=False)),
    ("drift", "write-report", "claude_code", 0.25,
     dict(n_calls=6, patterns=("thinking_stripped", "reserialised"))),
    ("context-last", "write-report", "openclaw", 0.5, dict(n_calls=6, patterns=("context_last",))),
    # Compacting after every turn: each of the 66 main calls is its own branch (> max_leaves = 64).
    ("over-branching", "write-report", "openclaw", 0.0,
     dict(n_calls=66, tokens_per_call=8, prompt_len=8, compact_every=1, vocab_size=1000)),
]


def main(out: pathlib.Path) -> None:
  rng = np.random.default_rng(20261130)
  if out.exists():
    os.remove(out)
  with CallLogWriter(out) as w:
    for name, task, harness, reward, kwargs in ROLLOUTS:
      rid = f"{task}/{harness}/{name}"
      kwargs = {"prompt_len": 32, "tokens_per_call": 20, "vocab_size": 32000, **kwargs}
      for call in synthetic.agent_rollout(rng, rollout_id=rid, task_id=task, harness=harness, **kwargs):
        w.write(call)
      w.write(RolloutRecord(rid, task, harness, reward, "ok"))
  print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
  main(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
