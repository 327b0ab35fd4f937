"""How the engine dispatches its work: k decode steps per dispatch sampled on the device (the same tokens and
log-probs whatever k is), requests admitted together prefilled together, the counters that show it, and
cached keys read block by block."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.engine import kv_forward
from clawjax.engine.engine import Engine
from clawjax.generation import SamplingParams
from tests.engine.conftest import SMALL, full_logits, learner_logprobs, prompt


def _run(model, config, cases):
  """Queues every case at once (the engine thread waits for its lock meanwhile), so that they are admitted
  together; (results in case order, the engine's counters after them)."""
  eng = Engine(model, config)
  try:
    with eng._cv:  # pylint: disable=protected-access
      futures = [eng.submit(ids, s) for ids, s in cases]
    return [f.result(timeout=300) for f in futures], eng.stats()
  finally:
    eng.close()


@pytest.mark.slow
def test_same_seed_same_tokens_and_logprobs_whatever_the_decode_steps(model):
  """Requests that end mid-dispatch (a stop token, max_new_tokens, max_seq_len) beside ones that go on:
  k = 1, 3 and 8 steps per dispatch give the same tokens and log-probs, equal to the learner's."""
  short = dataclasses.replace(SMALL, max_seq_len=60)  # every position within one 64-key bucket: few compiles
  free = SamplingParams(max_new_tokens=20, temperature=1.0, seed=22)
  (probe,), _ = _run(model, dataclasses.replace(short, decode_steps=1), [(prompt(22, 12), free)])
  stop = probe.output_ids[9]  # ends that request at its first occurrence, at most 10 tokens in
  cases = [(prompt(20, 7), SamplingParams(max_new_tokens=13, temperature=1.0, seed=20)),
           (prompt(21, 30), SamplingParams(max_new_tokens=9, temperature=0.7, top_k=20, seed=21)),
           (prompt(22, 12), dataclasses.replace(free, stop_token_ids=(stop,))),
           (prompt(23, 45), SamplingParams(max_new_tokens=40, temperature=1.0, seed=23))]  # cut at 60
  by_k = {k: _run(model, dataclasses.replace(short, decode_steps=k, decode_steps_busy=k), cases) for k in (1, 3, 8)}
  reference, _ = by_k[1]
  assert [r.finish_reason for r in reference] == ["length", "length", "stop", "length"]
  assert [len(r.output_ids) for r in reference] == [13, 9, probe.output_ids.index(stop) + 1, 15]
  for (ids, s), r in zip(cases, reference):
    np.testing.assert_allclose(r.output_logprobs, learner_logprobs(model, ids, r.output_ids, s.temperature),
                               atol=1e-4)
  for k in (3, 8):
    results, stats = by_k[k]
    for want, got in zip(reference, results):
      assert got.output_ids == want.output_ids and got.finish_reason == want.finish_reason
      np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, atol=1e-5)
    assert stats["tokens_decoded"] == sum(len(r.output_ids) - 1 for r in results)
    # All four run from the first dispatch on, each given k tokens a dispatch until it ends.
    assert stats["decode_dispatches"] == -(-(max(len(r.output_ids) for r in results) - 1) // k)


def test_one_request_decodes_64_tokens_in_8_dispatches(model):
  """The default k for a lone request: 64 new tokens are the prefill's first and 63 in 8 decode dispatches,
  streamed as those 9 runs."""
  eng = Engine(model, dataclasses.replace(SMALL, decode_steps=8))
  runs = []
  try:
    r = eng.submit(prompt(30, 20), SamplingParams(max_new_tokens=64, temperature=1.0, seed=30),
                   lambda ids, _: runs.append(len(ids))).result(timeout=300)
    stats = eng.stats()
  finally:
    eng.close()
  assert len(r.output_ids) == 64 and runs == [1] + [8] * 7 + [7]
  assert (stats["prefill_dispatches"], stats["decode_dispatches"], stats["tokens_decoded"]) == (1, 8, 63)
  assert stats["tokens_prefilled"] == 20


def test_requests_admitted_together_are_prefilled_together(model):
  """Three requests queued at once (one longer than a prefill chunk): their first chunks in one dispatch, the
  long one's rest in a second; the results equal those of each request alone."""
  cases = [(prompt(40 + i, n), SamplingParams(max_new_tokens=5, temperature=1.0, seed=i))
           for i, n in enumerate((5, 70, 33))]
  together, stats = _run(model, SMALL, cases)
  assert stats["prefill_dispatches"] == 2 and stats["tokens_prefilled"] == 5 + 70 + 33
  for case, got in zip(cases, together):
    (alone,), _ = _run(model, SMALL, [case])
    assert got.output_ids == alone.output_ids
    np.testing.assert_allclose(got.output_logprobs, alone.output_logprobs, atol=1e-5)
    np.testing.assert_allclose(got.output_logprobs, learner_logprobs(model, case[0], got.output_ids, 1.0),
                               atol=1e-4)


def test_prefill_dispatches_hold_at_most_prefill_tokens(model):
  """A budget of two padded 64-token chunks: the three requests' first chunks take two dispatches."""
  cases = [(prompt(50 + i, n), SamplingParams(max_new_tokens=2, temperature=0.0)) for i, n in enumerate((5, 70, 33))]
  _, stats = _run(model, dataclasses.replace(SMALL, prefill_tokens=128), cases)
  assert stats["prefill_dispatches"] == 2  # [5, 64 of 70], then [6 of 70, 33]


def test_cached_attention_by_key_blocks_equals_float64_brute_force():
  """The queries' attention to their slots' cached keys, read in blocks of 16 (online softmax, stopping after
  the block of the last real query) and in one score array: both equal float64 brute force. Rows of one
  call reach different lengths; GQA, 4 query heads over 2 cached ones. A padding row sits at the cache's end
  (the engine's padding position) and every value past the real rows' reach is NaN: a block read there
  would turn the real rows' outputs to NaN, so the padding row must not extend the reach."""
  rng = np.random.default_rng(0)
  layers, slots, kv, capacity, h, n, t = 2, 5, 2, 160, 8, 4, 6
  k_cache, v_cache = (rng.normal(size=(layers, slots, kv, capacity, h)).astype(np.float32) for _ in range(2))
  slots_B = np.array([3, 0, 4, 0], np.int32)
  positions_BT = np.array([40, 90, 61, capacity - t], np.int32)[:, None] + np.arange(t, dtype=np.int32)[None]
  reach = 95  # the real rows' last position (< 128)
  v_cache[:, :, :, 96:] = np.nan  # past the block of position 95
  q_BTNH = rng.normal(size=(4, t, n, h)).astype(np.float32)

  want = np.zeros(q_BTNH.shape)
  for b, slot in enumerate(slots_B[:3]):
    for i, pos in enumerate(positions_BT[b]):
      for head in range(n):
        k_SH, v_SH = (c[1, slot, head // (n // kv), :pos + 1].astype(np.float64) for c in (k_cache, v_cache))
        s_S = k_SH @ q_BTNH[b, i, head].astype(np.float64) / np.sqrt(h)
        p_S = np.exp(s_S - s_S.max())
        want[b, i, head] = p_S @ v_SH / p_S.sum()
  for block, cache_len in ((16, 128), (96, 96)):  # 96 = cache_len: one score array
    got = kv_forward.cached_attention(jnp.asarray(q_BTNH), jnp.asarray(k_cache), jnp.asarray(v_cache), 1,
                                      jnp.asarray(slots_B), jnp.asarray(positions_BT), cache_len, block,
                                      jnp.int32(reach))
    np.testing.assert_allclose(np.asarray(got)[:3], want[:3], atol=2e-6)


def test_padding_rows_do_not_extend_the_keys_read(model):
  """A padded batch, one row longer than the others: prefill and decode dispatches read the cache up to the
  block of the real rows' last position, whatever the padding rows' positions (the cache's end). Every cached
  value past that block is NaN, so a block read there would show; tokens and log-probs are the learner's."""
  config = dataclasses.replace(SMALL, attention_block=16)
  runner = kv_forward.KVRunner(model, config, [jax.devices()[0]])
  weights = runner.weights(nnx.state(model))
  inputs = [prompt(70, 5), prompt(71, 50), prompt(72, 20)]  # 3 rows: padded to 4
  steps, new = 8, 9  # the prefill's token, then one decode dispatch of 8
  last = max(len(ids) for ids in inputs) + steps - 1  # the last position a real row writes or reads
  k_cache, v_cache = runner.init_cache()
  v_cache = v_cache.at[:, :, :, (last // 16 + 1) * 16:].set(jnp.nan)
  cache = (k_cache, v_cache)
  greedy = SamplingParams(max_new_tokens=new, temperature=0.0)
  key = np.zeros(2, np.uint32)
  chunks = [kv_forward.PrefillChunk(slot, np.asarray(ids, np.int32), 0, key, greedy) for slot, ids in enumerate(inputs)]
  cache, first, _, _ = runner.prefill(weights, cache, chunks)  # (no routes recorded)
  decode = [kv_forward.DecodeRow(slot, int(first[slot]), len(ids), key, 1, new - 1, greedy)
            for slot, ids in enumerate(inputs)]
  cache, runs, logprobs, _ = runner.decode(weights, cache, decode, steps)
  for slot, ids in enumerate(inputs):
    out = [int(first[slot])] + [int(x) for x in runs[slot]]
    assert len(out) == new
    seq = list(ids)
    for _ in range(new):  # brute force: one full forward per token, no cache
      seq.append(int(np.argmax(full_logits(model, seq)[-1])))
    assert out == seq[len(ids):]
    np.testing.assert_allclose(logprobs[slot], learner_logprobs(model, ids, out, 0.0)[1:], atol=1e-4)
  # Both dispatches had a padding row at the cache's end; the prefill's reach is its real rows'.
  rows, _ = runner.prefill_batch(chunks)
  assert len(rows.slots) == 4 and rows.starts[3] + rows.tokens.shape[1] == runner.capacity and rows.reach == 49
  assert runner.decode_batch(decode, steps)[0].positions[3] == runner.capacity - 1


def test_keys_read_block_by_block_give_the_same_tokens_and_logprobs(model):
  """An engine whose attention reads cached keys 16 at a time (every cache bucket here is longer) samples
  what one with a single score array samples, requests of different lengths admitted together."""
  cases = [(prompt(50 + i, n), SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
           for i, n in enumerate((9, 70, 130))]
  one_array, _ = _run(model, SMALL, cases)
  by_block, _ = _run(model, dataclasses.replace(SMALL, attention_block=16), cases)
  for (ids, s), want, got in zip(cases, one_array, by_block):
    assert got.output_ids == want.output_ids
    np.testing.assert_allclose(got.output_logprobs, want.output_logprobs, atol=1e-5)
    np.testing.assert_allclose(got.output_logprobs, learner_logprobs(model, ids, got.output_ids, s.temperature),
                               atol=1e-4)
