"""What one generation is asked and what it returns: the records the rollout engine and the shim's backends
share. JAX-free, and below both (it imports only `clawjax.calllog`), so the engine needs nothing of the
serving package.

Log-prob convention (every engine and backend): `output_logprobs[i]` is log softmax(logits / T) over the
full vocabulary at the sampling temperature T, evaluated at `output_ids[i]`, before any top-p/top-k
truncation (the learner recomputes exactly this as log pi_old). At T == 0 (greedy) use T = 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from clawjax.calllog import MAX_TOKEN_ID, is_logprob, is_token_id
from clawjax.routes import RoutedExperts

# "stop": a stop token ended the turn; "length": max_new_tokens; "abort": the engine gave up.
FINISH_REASONS = ("stop", "length", "abort")

# Receives each run of newly sampled ids, in order, while a generation runs.
TokenSink = Callable[[Sequence[int]], None]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """What the shim asks of one generation. `stop_token_ids` end the turn (included in the output)."""
  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = -1  # -1: no top-k truncation.
  stop_token_ids: tuple[int, ...] = ()
  seed: int | None = None


def _check_each(values: tuple, field: str, ok: Callable[[Any], bool], problem: str) -> None:
  if not all(map(ok, values)):
    i, v = next((i, v) for i, v in enumerate(values) if not ok(v))
    raise ValueError(f"Generation: {field}[{i}] is {v!r}, {problem}")


@dataclasses.dataclass(frozen=True)
class Generation:
  """One sampled continuation.

  output_ids: sampled ids, including the stop token when finish_reason == "stop".
  output_logprobs: one per output id, the convention in the module docstring.
  finish_reason: one of FINISH_REASONS.
  policy_version: the weights version that sampled every token of it (None if the engine has none).
  cached_tokens: prompt tokens whose keys/values the engine had cached (None if it does not say): how
    well calls of one rollout land where their prefix is.
  routed_experts: the expert ids the engine's MoE layers chose (clawjax.routes), of every position it
    computed, [len(prompt) + len(output) - 1, layers, top_k], or of those from `start` on when only those
    were asked for (`GenerationRequest.routes_from`); None when the engine reports none.
  """
  output_ids: tuple[int, ...]
  output_logprobs: tuple[float, ...]
  finish_reason: str
  policy_version: int | None = None
  cached_tokens: int | None = None
  routed_experts: RoutedExperts | None = None

  def __post_init__(self):
    # An engine's bad answer fails here, as a backend failure (an error record and an API error), not
    # later when the call's record would not validate.
    if len(self.output_ids) != len(self.output_logprobs):
      raise ValueError(f"Generation: {len(self.output_ids)} output_ids but "
                       f"{len(self.output_logprobs)} output_logprobs")
    _check_each(self.output_ids, "output_ids", is_token_id, f"not a token id in [0, {MAX_TOKEN_ID}]")
    _check_each(self.output_logprobs, "output_logprobs", is_logprob, "not a finite log-probability")
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(f"Generation: finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
