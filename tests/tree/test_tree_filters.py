"""Filters drop exactly what the synthetic ground truth (`extra["synthetic"]`) says they should."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings

from clawjax.calllog import CallRecord
from clawjax.tree import synthetic
from clawjax.tree.filters import TRAIN, FilterConfig, filter_rollout

from tests.tree.reference import make_call, patterned_rollouts, rollouts

SETTINGS = settings(max_examples=60, deadline=None)


def expected_reason(c: CallRecord) -> str:
  kind = c.extra["synthetic"]
  if c.role is None:
    # Structural inference: compaction shares the main line (trained); any side call under its
    # own system prompt is a subagent-like side branch.
    return {"main": TRAIN, "compaction": TRAIN, "auxiliary": "subagent"}.get(kind, kind)
  return TRAIN if kind == "main" else kind


@given(rollouts())
@SETTINGS
def test_filters_match_ground_truth(calls):
  f = filter_rollout("r", calls)
  assert f.reasons == {c.call_index: expected_reason(c) for c in calls}
  assert set(f.inferred) == {c.call_index for c in calls if c.role is None and c.status == "ok"}


@given(patterned_rollouts(label_roles=True))
@SETTINGS
def test_drift_and_leaves_follow_the_patterns(patterns_calls):
  patterns, calls = patterns_calls
  f = filter_rollout("r", calls)
  n_main = sum(c.extra["synthetic"] == "main" for c in calls)
  compacted = any(c.extra["synthetic"] == "compaction" for c in calls)  # one more path
  if "context_last" in patterns:  # no input extends another: one branch per call, echoes, no drift
    assert f.drift_calls == 0 and f.leaves == n_main
  elif "thinking_stripped" in patterns:  # every echoed main output changed
    assert f.drift_calls == n_main - 1 and f.leaves == n_main
  elif "reserialised" in patterns:
    # One echoed output changed (unless it was the last); only the compaction call may have read
    # it, in which case the kept tree does not branch.
    assert f.drift_calls <= 1 and f.leaves - compacted in (1, 1 + f.drift_calls)
  else:
    assert f.drift_calls == 0 and f.leaves == 1 + compacted


def test_thinking_stripped_branches_at_every_turn():
  calls = synthetic.agent_rollout(np.random.default_rng(0), rollout_id="r", n_calls=6, prompt_len=30,
                                  tokens_per_call=20, patterns=("thinking_stripped",))
  f = filter_rollout("r", calls)
  assert (f.drift_calls, f.leaves, f.over_branching) == (5, 6, False)
  g = filter_rollout("r", calls, dataclasses.replace(FilterConfig(), max_leaves=5))
  assert g.over_branching and g.leaves == 6 and g.trained == [] and g.tree.size == 0


def test_reserialised_tool_call_is_one_drift():
  calls = synthetic.agent_rollout(np.random.default_rng(1), rollout_id="r", n_calls=6, prompt_len=30,
                                  tokens_per_call=20, patterns=("reserialised",))
  f = filter_rollout("r", calls)
  assert (f.drift_calls, f.leaves) == (1, 2)
  assert len(f.trained) == 6


def test_rewritten_retry_and_shared_prefix_retry_are_dead_leaves():
  p = [1, 2, 3]
  calls = [
      make_call(0, p, [10, 11]),
      make_call(1, p + [10, 11, 20, 21], [30, 31, 32]),        # malformed tool call
      make_call(2, p + [10, 11, 20, 22], [30, 33]),            # retry, last message rewritten; same 1st token
      make_call(3, p + [10, 11, 20, 22, 30, 33, 40], [50]),    # continues the retry
  ]
  assert filter_rollout("r", calls).reasons == {0: TRAIN, 1: "retry", 2: TRAIN, 3: TRAIN}


def test_last_call_before_compaction_is_kept():
  # The compaction call has its own prompt and does not extend the main history; the compacted
  # call restarts from the first prompt. Neither replaces call 0 (paper: segments between
  # compaction points are separate).
  calls = [make_call(0, [1, 2, 3], [10]), make_call(1, [9, 8, 1, 2, 3, 10], [11], role="compaction"),
           make_call(2, [1, 2, 4, 11], [12])]
  assert filter_rollout("r", calls).reasons == {0: TRAIN, 1: "compaction", 2: TRAIN}


def test_error_call_is_dropped_and_role_outranks_retry():
  calls = [make_call(0, [1, 2], [], status="error"), make_call(1, [1, 2], [5], role="auxiliary"),
           make_call(2, [1, 2], [6]), make_call(3, [1, 2, 6, 7], [8])]
  assert filter_rollout("r", calls).reasons == {0: "error", 1: "auxiliary", 2: TRAIN, 3: TRAIN}


def test_filter_config_rejects_bad_fields():
  with pytest.raises(ValueError, match="max_leaves"):
    FilterConfig(max_leaves=0)
  with pytest.raises(ValueError, match="excluded_roles"):
    FilterConfig(excluded_roles=("main",))
  with pytest.raises(ValueError, match="side_branch_shared_frac"):
    FilterConfig(side_branch_shared_frac=1.5)


def test_identical_retry_with_identical_output_is_kept_and_trained_once():
  # Deterministic decoding: the retry re-sampled the same output, which the history then continued.
  p = [1, 2, 3]
  calls = [make_call(0, p, [5, 6]), make_call(1, p, [5, 6]), make_call(2, p + [5, 6, 7], [8])]
  f = filter_rollout("r", calls)
  assert f.reasons == {0: TRAIN, 1: TRAIN, 2: TRAIN}
  assert f.tree.owner_T.tolist() == [-1, -1, -1, 0, 0, -1, 2]


def test_moved_context_message_continues_through_the_echoed_output():
  # OpenClaw-like: a context message [9, 9] always sits last, so no input extends the previous one;
  # the echoed outputs show the history went on. With an echo run longer than the outputs, the
  # same calls look like replaced retries.
  sys_, out0, out1 = [1, 2, 3], list(range(20, 30)), list(range(40, 50))
  calls = [make_call(0, sys_ + [9, 9, 5], out0),
           make_call(1, sys_ + [5] + out0 + [6, 6, 9, 9, 5], out1),
           make_call(2, sys_ + [5] + out0 + [6, 6, 5] + out1 + [7, 9, 9, 5], [60])]
  f = filter_rollout("r", calls)
  assert f.reasons == {0: TRAIN, 1: TRAIN, 2: TRAIN} and f.drift_calls == 0 and f.leaves == 3
  strict = filter_rollout("r", calls, dataclasses.replace(FilterConfig(), echo_run=11))
  assert strict.reasons == {0: TRAIN, 1: TRAIN, 2: TRAIN}  # whole outputs (10 < 11) still match
  calls[2] = make_call(2, sys_ + [5] + out0[:5] + [0] + out0[5:] + [6, 6, 5] + out1[:4] + [7, 9, 9, 5],
                       [60])
  broken = filter_rollout("r", calls)  # call 1's output is not echoed in 8-token runs any more
  assert broken.reasons == {0: TRAIN, 1: "retry", 2: TRAIN}
