"""The engine against a plain full-sequence forward of the same model (the learner's computation)."""

import asyncio
import concurrent.futures
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from clawjax.engine.engine import Engine, EngineError
from clawjax.generation import SamplingParams
from clawjax.serving.backends.embedded import EmbeddedBackend
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from tests.engine.conftest import SMALL, full_logits, learner_logprobs, prompt, tiny_model


def test_concurrent_requests_logprobs_equal_learner_recompute(engine, model):
  # Mixed lengths (one longer than a prefill chunk), mixed sampling settings, more requests than slots.
  cases = [(prompt(i, n), SamplingParams(max_new_tokens=m, temperature=t, top_k=k, top_p=p, seed=i))
           for i, (n, m, t, k, p) in enumerate([(5, 12, 1.0, -1, 1.0), (70, 9, 0.7, 20, 1.0),
                                                (33, 15, 1.3, -1, 0.9), (1, 6, 0.0, -1, 1.0),
                                                (40, 11, 0.5, 5, 0.5), (17, 8, 1.0, -1, 1.0)])]
  futures = [engine.submit(ids, s) for ids, s in cases]
  for (ids, s), fut in zip(cases, futures):
    r = fut.result(timeout=120)
    assert len(r.output_ids) == s.max_new_tokens and r.finish_reason == "length"
    want = learner_logprobs(model, ids, r.output_ids, s.temperature)
    np.testing.assert_allclose(r.output_logprobs, want, atol=1e-4)
    assert r.policy_version == engine.version


def test_tokens_are_followed_as_they_are_sampled(engine):
  """on_tokens (engine thread) sees each dispatch's run of tokens once, in order, before the result: the
  prefill's first token, then runs of decode_steps; generate's on_tokens runs on the caller's loop, every
  call before the result arrives there."""
  import asyncio
  import threading
  seen, threads = [], set()

  def on_tokens(ids, logprobs):
    seen.append((ids, logprobs))
    threads.add(threading.current_thread().name)

  sampling = SamplingParams(max_new_tokens=11, temperature=1.0, seed=3)
  r = engine.submit(prompt(12, 9), sampling, on_tokens).result(timeout=120)
  assert threads == {"clawjax-engine"}
  assert [len(ids) for ids, _ in seen] == [1, SMALL.decode_steps, 10 - SMALL.decode_steps]
  assert sum((ids for ids, _ in seen), ()) == r.output_ids
  assert sum((lps for _, lps in seen), ()) == r.output_logprobs

  async def follow():
    got = []
    result = await engine.generate(prompt(12, 9), sampling, lambda ids: got.append(
        (tuple(ids), threading.current_thread() is threading.main_thread())))
    return got, result

  got, again = asyncio.run(follow())
  assert again.output_ids == r.output_ids  # (seeded)
  assert got == [(ids, True) for ids, _ in seen]


def test_greedy_equals_argmax_of_full_forward(engine, model):
  ids = prompt(11, 25)
  r = engine.submit(ids, SamplingParams(max_new_tokens=10, temperature=0.0)).result(timeout=120)
  seq = list(ids)
  for _ in range(10):  # brute force: one full forward per token, no cache
    seq.append(int(np.argmax(full_logits(model, seq)[-1])))
  assert list(r.output_ids) == seq[len(ids):]


def test_seeded_request_is_reproducible_alone_or_batched(engine):
  s = SamplingParams(max_new_tokens=10, temperature=1.0, seed=1234)
  alone = engine.submit(prompt(3, 20), s).result(timeout=120)
  others = [engine.submit(prompt(i, 30 + i), SamplingParams(max_new_tokens=14, seed=i)) for i in range(3)]
  batched = engine.submit(prompt(3, 20), s)
  assert batched.result(timeout=120).output_ids == alone.output_ids
  np.testing.assert_allclose(batched.result().output_logprobs, alone.output_logprobs, atol=1e-5)
  for f in others:
    f.result(timeout=120)


def test_prefix_reuse_matches_uncached_generation(model):
  # One running sequence at a time; the other slots only retain prefixes.
  eng = Engine(model, dataclasses.replace(SMALL, max_running=1))
  try:
    first_in = prompt(5, 60)
    first = eng.submit(first_in, SamplingParams(max_new_tokens=8, temperature=0.0)).result(timeout=120)
    # Another rollout's calls in between take other slots, not this prefix's.
    for i in range(2):
      eng.submit(prompt(50 + i, 20), SamplingParams(max_new_tokens=3)).result(timeout=120)
    # The agent's next call: previous input + output + a "tool result".
    second_in = first_in + list(first.output_ids) + prompt(6, 7)
    s = SamplingParams(max_new_tokens=10, temperature=0.9, seed=7)
    cached = eng.submit(second_in, s).result(timeout=120)
    assert cached.cached_tokens == len(first_in) + len(first.output_ids) - 1
    eng.flush_cache()
    uncached = eng.submit(second_in, s).result(timeout=120)
    assert uncached.cached_tokens == 0
    assert cached.output_ids == uncached.output_ids
    np.testing.assert_allclose(cached.output_logprobs, uncached.output_logprobs, atol=1e-5)
    np.testing.assert_allclose(cached.output_logprobs,
                               learner_logprobs(model, second_in, cached.output_ids, 0.9), atol=1e-4)
    # A repeated identical input reuses all but its last token.
    again = eng.submit(second_in, s).result(timeout=120)
    assert again.cached_tokens == len(second_in) - 1 and again.output_ids == cached.output_ids
  finally:
    eng.close()


def test_stop_token_is_included_and_ends_the_request(engine):
  ids = prompt(8, 12)
  free = engine.submit(ids, SamplingParams(max_new_tokens=12, temperature=0.0)).result(timeout=120)
  stop = free.output_ids[4]
  first = free.output_ids.index(stop)
  r = engine.submit(ids, SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=(stop,))).result(120)
  assert r.finish_reason == "stop" and r.output_ids == free.output_ids[:first + 1]


def test_sequence_is_cut_at_max_seq_len(model):
  eng = Engine(model, SMALL)
  try:
    r = eng.submit(prompt(9, 180), SamplingParams(max_new_tokens=50, temperature=0.0)).result(timeout=120)
    assert r.finish_reason == "length" and len(r.output_ids) == SMALL.max_seq_len - 180
    with pytest.raises(EngineError, match="max_seq_len"):
      eng.submit(prompt(9, SMALL.max_seq_len), SamplingParams(max_new_tokens=1))
  finally:
    eng.close()


@pytest.mark.parametrize("ids,sampling,match", [
    ([], SamplingParams(max_new_tokens=1), "non-empty"),
    ([1, 512], SamplingParams(max_new_tokens=1), "out of range"),
    ([1], SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ([1], SamplingParams(max_new_tokens=1, top_p=0.0), "top_p")])
def test_bad_requests_are_refused_with_the_field_named(engine, ids, sampling, match):
  with pytest.raises(EngineError, match=match):
    engine.submit(ids, sampling)


def test_weight_update_changes_outputs_and_bumps_version(model):
  eng = Engine(model, SMALL)
  other = tiny_model(1)
  try:
    ids, s = prompt(12, 20), SamplingParams(max_new_tokens=8, temperature=0.0)
    before = eng.submit(ids, s).result(timeout=120)
    assert eng.update_from_model(other) == 1
    after = eng.submit(ids, s).result(timeout=120)
    assert (before.policy_version, after.policy_version) == (0, 1)
    assert after.cached_tokens == 0  # the old prefix's keys/values are stale
    assert after.output_ids != before.output_ids
    np.testing.assert_allclose(after.output_logprobs, learner_logprobs(other, ids, after.output_ids, 0.0),
                               atol=1e-4)
    # A learner's state sharded over the 8-device test mesh is accepted as is.
    mesh = jax.make_mesh((8,), ("data",))
    third = tiny_model(4)
    sharded = jax.device_put(nnx.state(third), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    assert eng.update_params(sharded) == 2
    r = eng.submit(ids, s).result(timeout=120)
    np.testing.assert_allclose(r.output_logprobs, learner_logprobs(third, ids, r.output_ids, 0.0), atol=1e-4)
    with pytest.raises(ValueError, match="shape"):
      eng.update_from_model(Decoder(preset("test-tiny-vocab").replace(mlp_dim=64), rngs=nnx.Rngs(0)))
  finally:
    eng.close()


def test_the_caller_may_delete_its_arrays_once_the_engine_has_its_weights(model):
  """The engine shares the caller's device and dtypes here, where a move would be a no-op: Engine(model) and
  update_params copy what they keep, so deleting every array the caller handed over (as a learner that
  donates its state does) leaves the next requests working, on the weights that were handed over."""
  ids, s = prompt(14, 20), SamplingParams(max_new_tokens=8, temperature=1.0, seed=14)

  def handed_over_and_deleted(seed: int, model: Decoder) -> None:
    for x in jax.tree.leaves(nnx.state(model)):
      x.delete()
    r = eng.submit(ids, s).result(timeout=120)
    np.testing.assert_allclose(r.output_logprobs, learner_logprobs(tiny_model(seed), ids, r.output_ids, 1.0),
                               atol=1e-4)

  first, second = tiny_model(5), tiny_model(6)
  eng = Engine(first, SMALL)
  try:
    handed_over_and_deleted(5, first)
    assert eng.update_params(nnx.state(second)) == 1
    handed_over_and_deleted(6, second)
  finally:
    eng.close()


@pytest.mark.parametrize("mode", ["drain", "abort"])
def test_request_in_flight_during_update_never_mixes_versions(model, mode):
  eng = Engine(model, dataclasses.replace(SMALL, update_mode=mode))
  other = tiny_model(2)
  try:
    ids = prompt(13, 10)
    long_run = eng.submit(ids, SamplingParams(max_new_tokens=150, temperature=1.0, seed=3))
    while eng.stats()["running"] == 0:
      pass
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
      version = pool.submit(eng.update_from_model, other).result(timeout=120)
    r = long_run.result(timeout=120)
    assert version == 1 and r.policy_version == 0
    if mode == "drain":
      assert r.finish_reason == "length" and len(r.output_ids) == 150
    else:
      assert r.finish_reason == "abort" and len(r.output_ids) < 150
    # Every token it did produce came from the old weights.
    np.testing.assert_allclose(r.output_logprobs, learner_logprobs(model, ids, r.output_ids, 1.0), atol=1e-4)
  finally:
    eng.close()


def test_closed_engine_refuses_and_fails_queued_requests(model):
  eng = Engine(model, SMALL)
  eng.close()
  with pytest.raises(EngineError) as e:
    eng.submit([1, 2], SamplingParams(max_new_tokens=1))
  assert e.value.status == 503


def test_embedded_backend_tells_the_shim_its_context(engine):
  # The shim holds prompts + generations to it (ShimServer._max_context), as for a remote engine.
  assert asyncio.run(EmbeddedBackend(engine, owns_engine=False).context_length()) == SMALL.max_seq_len
