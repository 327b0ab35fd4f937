"""The per-rollout summary that `python -m clawjax.tree summarize` prints, one JSON object a rollout.

Keys (exactly these):
  rollout_id; calls (call records, error calls included); trained_calls (calls whose output enters the
  loss); dropped (calls left out, by reason: retry, compaction, subagent, auxiliary, error; a role=null
  side branch counts as subagent); over_branching (the rollout was dropped whole: its trained calls
  and token counts are then 0, and `leaves` is the leaf count that exceeded the limit); leaves (leaves
  of the kept tree); unique_tokens (tokens in the kept tree: what a tree-packed learner processes);
  path_tokens (sum of root-to-leaf lengths over kept leaves: what the paths layout processes);
  call_tokens (sum of len(input_ids) + len(output_ids) over trained calls: what a per-call learner
  processes); loss_tokens (sampled tokens that enter the loss, each once); drift_calls (calls whose
  input diverged inside the output of the call they continue).
"""

from __future__ import annotations

from typing import Any

from clawjax.tree.filters import DROP_REASONS, FilteredRollout

KEYS = ("rollout_id", "calls", "trained_calls", "dropped", "over_branching", "leaves", "unique_tokens",
        "path_tokens", "call_tokens", "loss_tokens", "drift_calls")


def summarize(f: FilteredRollout) -> dict[str, Any]:
  trained = f.trained
  reasons = list(f.reasons.values())
  return {
      "rollout_id": f.rollout_id,
      "calls": len(f.calls),
      "trained_calls": len(trained),
      "dropped": {r: reasons.count(r) for r in DROP_REASONS},
      "over_branching": f.over_branching,
      "leaves": f.leaves,
      "unique_tokens": f.tree.size,
      "path_tokens": f.tree.path_tokens(),
      "call_tokens": sum(len(c.input_ids) + len(c.output_ids) for c in trained),
      "loss_tokens": f.tree.loss_tokens,
      "drift_calls": f.drift_calls,
  }
