"""One step's data: exclusions are counted, GRPO groups are (task, harness) pairs, advantages reach the
packed tokens. Checked against a float64 numpy reference of Eq. 1."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from clawjax.calllog import CallLogWriter, CallRecord, LoadedLog, RolloutRecord, load
from clawjax.train.step_data import BatchConfig, build_step, has_data, step_metrics, summary
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.synthetic import agent_group
from clawjax.tree.vocab import VocabularyError

VOCAB = 500
SMALL = dict(prompt_len=60, n_calls=3, tokens_per_call=20, vocab_size=VOCAB)


def _versioned(c: CallRecord) -> CallRecord:
  """A synthetic call (no version) as sampled by the learner's policy 0 (an unversioned call is stale)."""
  return c if c.policy_version is not None else dataclasses.replace(c, policy_version=0)


def _log(groups) -> LoadedLog:
  calls, rollouts = {}, {}
  for cs, outs in groups:
    for c in cs:
      calls.setdefault(c.rollout_id, []).append(_versioned(c))
    rollouts.update({o.rollout_id: o for o in outs})
  return LoadedLog(calls=calls, rollouts=rollouts, problems=[])


def _reference(rewards: list[float]) -> np.ndarray:
  r = np.asarray(rewards, np.float64)
  return (r - r.mean()) / (r.std() + 1e-6)


def _token_advantages(data) -> dict[str, set[float]]:
  """rollout id -> the set of advantages its loss tokens carry in the packed batches."""
  out: dict[str, set[float]] = {}
  for b in data.batches:
    mask = b.loss_mask_RT()
    for r, t in zip(*np.nonzero(mask)):
      out.setdefault(b.rollout_ids_N[b.rollout_index_RT[r, t]], set()).add(float(b.advantages_RT[r, t]))
  return out


def test_mix_harness_groups_never_mix():
  rng = np.random.default_rng(0)
  ra, rb = [0.0, 1.0, 0.5, 1.0], [1.0, 1.0, 0.0, 0.25]
  log = _log([agent_group(rng, task_id="t", harness="openclaw", n_rollouts=4, rewards=ra, **SMALL),
              agent_group(rng, task_id="t", harness="claude_code", n_rollouts=4, rewards=rb, **SMALL)])
  data = build_step(log, policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert sorted(data.scores.groups) == [("t", "claude_code", None), ("t", "openclaw", None)]
  got = _token_advantages(data)
  for harness, rewards in (("openclaw", ra), ("claude_code", rb)):
    for i, a in enumerate(_reference(rewards)):
      (value,) = got[f"t/{harness}/{i}"]  # every loss token of a rollout carries its one advantage
      np.testing.assert_allclose(value, a, rtol=1e-5, atol=1e-6)
  m = step_metrics([summary(data)])
  np.testing.assert_allclose(m["reward_harness/openclaw/mean"], np.mean(ra))
  np.testing.assert_allclose(m["reward_group/t/claude_code/std"], np.std(rb))


def test_excluded_rollouts_are_counted_and_never_trained():
  rng = np.random.default_rng(1)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=8,
                            rewards=[0.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.9], **SMALL)
  outs[1] = dataclasses.replace(outs[1], status="failed", reward=None)
  outs[2] = dataclasses.replace(outs[2], status="timeout", reward=None)
  outs[3] = dataclasses.replace(outs[3], reward=float("nan"))
  stale = {outs[4].rollout_id}
  calls = [dataclasses.replace(c, policy_version=3 if c.rollout_id in stale else 5) for c in calls]
  log = _log([(calls, outs[:7])])  # outs[7]: calls but no rollout record (never finished)
  data = build_step(log, policy_version=5, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4, max_staleness=1))
  assert data.counts["status_failed"] == 1 and data.counts["status_timeout"] == 1
  assert data.counts["nonfinite_reward"] == 1 and data.counts["stale"] == 1
  assert data.counts["no_record"] == 1
  trained = {rid for b in data.batches for rid in b.rollout_ids_N}
  assert trained == {outs[i].rollout_id for i in (0, 5, 6)}
  # The group's statistics include the stale rollout: it is scored, only not trained.
  want = dict(zip((0, 4, 5, 6), _reference([0.0, 0.5, 0.5, 0.2])))
  for i in (0, 5, 6):
    np.testing.assert_allclose(_token_advantages(data)[outs[i].rollout_id].pop(), want[i], rtol=1e-5)
  assert data.counts["scored_untrained"] == 1
  assert all(np.isfinite(b.advantages_RT).all() and np.isfinite(b.returns_RT).all() for b in data.batches)


def test_group_statistics_cover_every_scored_rollout():
  """Rewards [1, 1, 0, 0] whose two failures are too long to train: the successes keep A = +1, as over
  the whole group, instead of a zero-variance group of two successes at A = 0."""
  rng = np.random.default_rng(3)
  short = agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[1.0, 1.0], **SMALL)
  long = agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[0.0, 0.0],
                     **{**SMALL, "n_calls": 12})
  long = ([dataclasses.replace(c, rollout_id=c.rollout_id + "-long") for c in long[0]],
          [dataclasses.replace(o, rollout_id=o.rollout_id + "-long") for o in long[1]])
  row_len = max(_tree_size(short)) + 1
  assert min(_tree_size(long)) > row_len
  data = build_step(_log([short, long]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=row_len, rows=4))
  assert data.counts["too_long"] == 2 and data.counts["scored_untrained"] == 2
  got = _token_advantages(data)
  assert set(got) == {o.rollout_id for o in short[1]}
  for rid in got:
    np.testing.assert_allclose(got[rid].pop(), _reference([1.0, 1.0, 0.0, 0.0])[0], rtol=1e-5)  # +1
  assert data.tree_stats["zero_variance_groups"] == 0


def _tree_size(group) -> list[int]:
  calls, outs = group
  return [filter_rollout(o.rollout_id, [c for c in calls if c.rollout_id == o.rollout_id]).tree.size
          for o in outs]


def test_rewards_out_of_range_are_rejected_or_clipped():
  rng = np.random.default_rng(4)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=4, rewards=[0.0, 1.0, 0.5, 0.5], **SMALL)
  outs[2] = dataclasses.replace(outs[2], reward=1e308)  # a broken checker's "score"
  rejected = build_step(_log([(calls, outs)]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                        batch=BatchConfig(row_len=4096, rows=4))
  assert rejected.counts["reward_out_of_range"] == 1 and outs[2].rollout_id not in rejected.rewards
  got = _token_advantages(rejected)
  for i, a in zip((0, 1, 3), _reference([0.0, 1.0, 0.5])):
    np.testing.assert_allclose(got[outs[i].rollout_id].pop(), a, rtol=1e-5)
  clipped = build_step(_log([(calls, outs)]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                       batch=BatchConfig(row_len=4096, rows=4, out_of_range="clip"))
  assert clipped.rewards[outs[2].rollout_id] == 1.0
  assert all(np.isfinite(b.advantages_RT).all() for b in clipped.batches)


def test_uninformative_groups_can_be_left_out():
  rng = np.random.default_rng(5)
  flat = agent_group(rng, task_id="flat", harness="mini", n_rollouts=3, rewards=[1.0, 1.0, 1.0], **SMALL)
  spread = agent_group(rng, task_id="spread", harness="mini", n_rollouts=3, rewards=[0.0, 1.0, 0.5], **SMALL)
  kept = build_step(_log([flat, spread]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert len({rid for b in kept.batches for rid in b.rollout_ids_N}) == 6  # the paper's GRPO: all trained
  left_out = build_step(_log([flat, spread]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                        batch=BatchConfig(row_len=4096, rows=4, drop_uninformative_groups=True))
  assert {rid for b in left_out.batches for rid in b.rollout_ids_N} == {o.rollout_id for o in spread[1]}
  assert left_out.counts["uninformative"] == 3 and left_out.rewards.keys() == kept.rewards.keys()


def _draw(group: tuple[list[CallRecord], list[RolloutRecord]], draw: int):
  """The group's records as those of draw `draw` (the group index a run's records carry)."""
  calls, outs = group
  return calls, [dataclasses.replace(o, extra={**o.extra, "group": draw}) for o in outs]


def test_two_draws_of_a_pair_are_two_groups_for_uninformative_and_metrics():
  """(t, mini) drawn by two steps, [1, 1] and [0, 0], in one batch: each draw has no signal (merged they
  would look informative), so drop_uninformative_groups leaves all four out; the pair's std is that
  within the draws (0), not over the four rewards (0.5)."""
  rng = np.random.default_rng(7)
  ones = _draw(agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[1.0, 1.0], **SMALL), 3)
  rng = np.random.default_rng(8)  # other rollout ids: the synthetic ids name the task and index only
  zeros = agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[0.0, 0.0], **SMALL)
  zeros = _draw(([dataclasses.replace(c, rollout_id=f"{c.rollout_id}b") for c in zeros[0]],
                 [dataclasses.replace(o, rollout_id=f"{o.rollout_id}b") for o in zeros[1]]), 8)
  data = build_step(_log([ones, zeros]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4, drop_uninformative_groups=True))
  assert sorted(data.scores.groups) == [("t", "mini", 3), ("t", "mini", 8)]
  assert data.counts["uninformative"] == 4 and not any(b.rollout_ids_N for b in data.batches)
  assert data.tree_stats["zero_variance_groups"] == 2
  m = step_metrics([summary(data)])
  assert m["reward_group/t/mini/mean"] == 0.5 and m["reward_group/t/mini/std"] == 0.0


def test_a_call_without_a_version_makes_its_rollout_stale_and_is_counted():
  rng = np.random.default_rng(9)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=3, rewards=[0.0, 1.0, 0.5], **SMALL)
  unversioned = outs[0].rollout_id
  calls = [dataclasses.replace(c, policy_version=None if c.rollout_id == unversioned and c.call_index == 1 else 4)
           for c in calls]
  log = LoadedLog(calls={}, rollouts={o.rollout_id: o for o in outs}, problems=[])
  for c in calls:
    log.calls.setdefault(c.rollout_id, []).append(c)
  data = build_step(log, policy_version=5, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert data.counts["stale"] == 1 and data.counts["calls_without_version"] == 1
  assert {rid for b in data.batches for rid in b.rollout_ids_N} == {outs[1].rollout_id, outs[2].rollout_id}


def test_a_rollout_with_an_unreadable_call_is_left_out_whole(tmp_path):
  rng = np.random.default_rng(6)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[0.0, 1.0], **SMALL)
  for o in outs:
    with CallLogWriter(tmp_path / f"{o.rollout_id.replace('/', '_')}.jsonl") as w:
      for c in calls:
        if c.rollout_id == o.rollout_id:
          w.write(_versioned(c))
      w.write(o)
  broken = tmp_path / f"{outs[0].rollout_id.replace('/', '_')}.jsonl"
  lines = broken.read_text().splitlines(keepends=True)
  broken.write_text(lines[0] + lines[1][:40] + "\n" + "".join(lines[2:]))  # one call's line torn
  loaded = load(tmp_path, errors="collect")
  assert outs[0].rollout_id in loaded.excluded and outs[0].rollout_id in loaded.problems[0]
  data = build_step(loaded, policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert data.counts["unreadable"] == 1
  assert {rid for b in data.batches for rid in b.rollout_ids_N} == {outs[1].rollout_id}


def test_tree_longer_than_a_row_is_counted_not_fatal():
  rng = np.random.default_rng(2)
  log = _log([agent_group(rng, task_id="t", harness="mini", n_rollouts=2, rewards=[0.0, 1.0], **SMALL)])
  data = build_step(log, policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=32, rows=2))
  assert data.counts["too_long"] == 2 and not data.batches


def _with_id(c: CallRecord, field: str, at: int, token: int) -> CallRecord:
  ids = list(getattr(c, field))
  ids[at] = token
  return dataclasses.replace(c, **{field: tuple(ids)})


def test_a_rollout_holding_a_token_id_outside_the_vocabulary_is_counted_and_not_trained():
  """One rollout's output and another's input hold an id the model cannot read (its vocabulary's size, and
  an id of a larger tokenizer): both are left out, counted, and still scored with their group."""
  rng = np.random.default_rng(10)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=4, rewards=[0.0, 1.0, 0.5, 1.0], **SMALL)
  bad = {(outs[1].rollout_id, 2): ("output_ids", 3, VOCAB), (outs[2].rollout_id, 0): ("input_ids", 17, 8187)}
  calls = [_with_id(c, *bad[c.rollout_id, c.call_index]) if (c.rollout_id, c.call_index) in bad else c
           for c in calls]
  data = build_step(_log([(calls, outs)]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert data.counts["token_out_of_vocab"] == 2 and data.counts["scored_untrained"] == 2
  assert {rid for b in data.batches for rid in b.rollout_ids_N} == {outs[0].rollout_id, outs[3].rollout_id}
  assert all(b.tokens_RT.max() < VOCAB for b in data.batches)
  want = _reference([0.0, 1.0, 0.5, 1.0])
  for i in (0, 3):
    np.testing.assert_allclose(_token_advantages(data)[outs[i].rollout_id].pop(), want[i], rtol=1e-5)
  assert has_data(data, step=1)
  assert step_metrics([summary(data)])["count/token_out_of_vocab"] == 2


def test_a_step_whose_every_rollout_the_model_cannot_read_stops_the_run_naming_a_call():
  """Calls of an engine serving a larger vocabulary than the learner's model: every rollout holds an id
  past it, and the step stops the run with one line naming a call, the id and the vocabulary size."""
  rng = np.random.default_rng(11)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=3, rewards=[0.0, 1.0, 0.5], **SMALL)
  calls = [_with_id(c, "output_ids", 0, 8187 + i) if c.call_index == 1 else c for i, c in enumerate(calls)]
  data = build_step(_log([(calls, outs)]), policy_version=0, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert data.counts["token_out_of_vocab"] == 3 and not data.batches
  with pytest.raises(VocabularyError) as e:
    has_data(data, step=7)
  message = str(e.value)
  assert "\n" not in message
  first = next(c for c in calls if c.rollout_id == outs[0].rollout_id and c.call_index == 1)
  assert f"step 7: " in message and "different models" in message
  assert f"call 1 of rollout {outs[0].rollout_id}: token id {first.output_ids[0]} is outside the model's " \
         f"vocabulary [0, {VOCAB})" in message


def test_a_call_sampled_by_a_version_ahead_of_the_learner_is_counted_and_not_trained():
  """A replica that missed a resume's push still holds the crashed run's later weights (version 6, the
  learner at 5): its rollout is left out under its own reason, not trained as fresh."""
  rng = np.random.default_rng(12)
  calls, outs = agent_group(rng, task_id="t", harness="mini", n_rollouts=3, rewards=[0.0, 1.0, 0.5], **SMALL)
  ahead = outs[0].rollout_id
  calls = [dataclasses.replace(c, policy_version=6 if c.rollout_id == ahead and c.call_index == 2 else 5)
           for c in calls]
  data = build_step(_log([(calls, outs)]), policy_version=5, vocab_size=VOCAB, filters=FilterConfig(),
                    batch=BatchConfig(row_len=4096, rows=4))
  assert data.counts["version_ahead"] == 1 and "stale" not in data.counts
  assert {rid for b in data.batches for rid in b.rollout_ids_N} == {outs[1].rollout_id, outs[2].rollout_id}
  assert data.staleness == {0: 6}  # the two trained rollouts' three calls each, none "behind" by -1
