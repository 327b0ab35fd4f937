"""The engine survives any caller: one that gives up (a cancelled future, `generate` under a timeout) or whose
event loop has closed loses its own request only, which stops at its next step and frees its slot; the
engine serves on, with the outputs it gave before."""

import asyncio
import concurrent.futures
import threading
import time

import numpy as np
import pytest

from clawjax.engine.engine import Engine, EngineError
from clawjax.generation import SamplingParams
from tests.engine.conftest import SMALL, Parker, learner_logprobs, prompt

LONG = SamplingParams(max_new_tokens=150, temperature=1.0, seed=5)  # as long as SMALL's 192 allows


@pytest.fixture
def eng(model):
  """An engine of the test's own (one that dies must not take the module's with it)."""
  engine = Engine(model, SMALL)
  yield engine
  engine.close()


def _serves_on(eng: Engine, model) -> None:
  """Soon nothing is left running or queued, and a new request's output is the learner's."""
  deadline = time.monotonic() + 60
  while (eng.stats()["running"], eng.stats()["queued"]) != (0, 0) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert eng.alive and (eng.stats()["running"], eng.stats()["queued"]) == (0, 0)
  ids = prompt(7, 20)
  r = eng.submit(ids, SamplingParams(max_new_tokens=12, temperature=1.0, seed=7)).result(timeout=120)
  assert len(r.output_ids) == 12 and r.finish_reason == "length"
  np.testing.assert_allclose(r.output_logprobs, learner_logprobs(model, ids, r.output_ids, 1.0), atol=1e-4)


def test_three_callers_that_time_out_leave_the_engine_serving(eng, model):
  """Three `generate` calls under `asyncio.wait_for` time out while decoding (the engine parked meanwhile);
  they stop at the next step: nothing more is decoded for them, and the same three requests asked again
  get what they got before."""
  cases = [prompt(60 + i, n) for i, n in enumerate((9, 25, 40))]
  # The same dispatches as below, compiled here (under the engine's lock, requests are admitted together).
  with eng._cv:  # pylint: disable=protected-access
    futures = [eng.submit(ids, LONG) for ids in cases] + [eng.submit(Parker.PROMPT, Parker.SAMPLING)]
  before = [f.result(timeout=300) for f in futures][:len(cases)]
  eng.flush_cache()
  start = eng.stats()["tokens_decoded"]

  async def give_up_then_ask_again() -> list:
    seen = [[] for _ in cases]
    with eng._cv:  # pylint: disable=protected-access
      callers = [asyncio.ensure_future(asyncio.wait_for(eng.generate(ids, LONG, on_tokens=got.append), 3.0))
                 for ids, got in zip(cases, seen)]
      while eng.stats()["queued"] < len(cases):
        await asyncio.sleep(0)
      parker = Parker(eng, running=len(cases) + 1)
    outcomes = await asyncio.gather(*callers, return_exceptions=True)
    assert parker.parked.is_set() and all(isinstance(o, TimeoutError) for o in outcomes), outcomes
    assert all(seen)  # each was decoding when its caller gave up
    parker.release()  # (this loop stays open: only the cancellations are tested here)
    done = await asyncio.wrap_future(parker.future)
    assert len(done.output_ids) == Parker.SAMPLING.max_new_tokens
    # One decode run each (the parked dispatch's), then none.
    decoded = eng.stats()["tokens_decoded"] - start
    assert decoded <= Parker.SAMPLING.max_new_tokens - 1 + len(cases) * SMALL.decode_steps_busy, decoded
    _serves_on(eng, model)
    return [await eng.generate(ids, LONG) for ids in cases]

  for want, again in zip(before, asyncio.run(give_up_then_ask_again())):
    assert again.output_ids == want.output_ids
    np.testing.assert_allclose(again.output_logprobs, want.output_logprobs, atol=1e-5)


def test_a_cancelled_future_is_dropped_and_its_slot_freed(eng, model):
  """`future.cancel()` once the first token is out: the request gets no more tokens and nothing is set on its
  future; its slot keeps the prefix it wrote (the same input later reuses it)."""
  first, go, runs = threading.Event(), threading.Event(), []

  def on_tokens(ids, logprobs):
    runs.append(ids)
    first.set()
    go.wait(120)

  ids = prompt(61, 30)
  future = eng.submit(ids, LONG, on_tokens)
  assert first.wait(120)
  assert future.cancel()
  go.set()
  with pytest.raises(concurrent.futures.CancelledError):
    future.result(timeout=0)
  _serves_on(eng, model)
  assert len(runs) == 1 and eng.stats()["tokens_decoded"] == 11  # (the next request's 12 tokens, less its first)
  again = eng.submit(ids, SamplingParams(max_new_tokens=1, temperature=0.0)).result(timeout=120)
  assert again.cached_tokens == len(ids) - 1


def test_a_streaming_caller_whose_loop_closed_ends_its_request_only(eng, model):
  """`generate` streaming to an event loop that then closes: its next run of tokens cannot be delivered, which
  ends that request (the engine does not decode it further); the others, and the engine, go on."""
  loop = asyncio.new_event_loop()
  seen = []
  task = loop.create_task(eng.generate(prompt(62, 12), LONG, on_tokens=seen.append))
  while not seen:
    loop.run_until_complete(asyncio.sleep(0.005))
  parker = Parker(eng, running=2)
  assert parker.parked.wait(120)
  loop.close()  # the task still awaits its result
  start = eng.stats()["tokens_decoded"]
  parker.release()
  assert parker.future.result(timeout=120).finish_reason == "length"
  assert not task.done()
  decoded = eng.stats()["tokens_decoded"] - start
  # The companion's, and at most the parked dispatch's run.
  assert decoded <= Parker.SAMPLING.max_new_tokens - 1 + SMALL.decode_steps_busy, decoded
  _serves_on(eng, model)


def test_a_token_callback_that_raises_fails_its_own_request(eng, model):
  def on_tokens(ids, logprobs):
    raise ValueError("the caller's bug")

  future = eng.submit(prompt(63, 12), LONG, on_tokens)
  with pytest.raises(EngineError, match="token callback failed.*the caller's bug"):
    future.result(timeout=120)
  _serves_on(eng, model)
