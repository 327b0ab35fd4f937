"""Weight pushes under load through the SGLang-protocol server, which does what SGLang 0.5.23 does (its
tokenizer_manager.py, utils/aio_rwlock.py, scheduler.py): an update holds new requests and waits for
those in flight (or aborts them: `abort_all_requests`), flushing the prefix cache inside; `/flush_cache`
refuses a busy engine; an aborted stream ends with SGLang's abort event. The trainer's push
(`PolicySession.push`, the `sglang` backend) must succeed under load and leave no stale prefix cache,
and an aborted call must reach the harness as retryable."""

import asyncio
import contextlib
import dataclasses
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from clawjax.engine.engine import Engine
from clawjax.engine.server import FLUSH_FAILED, FLUSH_TIMED_OUT, EngineServer
from clawjax.generation import SamplingParams
from clawjax.models import hf_io
from clawjax.models.loading import load_weights
from clawjax.run.session import PolicySession
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend
from clawjax.train.config import train_config
from tests.engine.conftest import SMALL, learner_logprobs, prompt, tiny_model
from tests.serving.test_backends import EngineServer as Serving
from tests.train.test_e2e import _task_dir

TOKEN = "the-trainers-admin-token"
PARAMS = SamplingParams(max_new_tokens=100, temperature=1.0, seed=4)


class PacedEngine(Engine):
  """The engine, whose thread (every request with it) stops once `hold_after(n)` more runs of sampled
  tokens have gone out, until `go()`: the time a long turn takes, at will."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._left: int | None = None
    self._go = threading.Event()
    self.stopped = threading.Event()  # the thread waits for `go()`

  def hold_after(self, runs: int) -> None:
    self._go.clear()
    self.stopped.clear()
    self._left = runs

  def go(self) -> None:
    self._left = None
    self._go.set()

  def submit(self, input_ids, sampling, on_tokens=None):
    def paced(ids, logprobs):
      if on_tokens is not None:
        on_tokens(ids, logprobs)
      if self._left is not None:
        self._left -= 1
        if self._left < 0:
          self.stopped.set()
          self._go.wait()
    return super().submit(input_ids, sampling, paced)


@contextlib.contextmanager
def engine_server(model):
  """The SGLang-protocol server over `model` on a thread: (url, its EngineServer)."""
  engine = PacedEngine(model, SMALL)
  server = EngineServer(engine, "test-tiny-vocab",
                        lambda path, version: engine.update_from_model(load_weights(path, model), version),
                        admin_token=TOKEN)
  try:
    with Serving({}, app=server.app) as serving:
      yield serving.url, server, engine
  finally:
    engine.go()
    engine.close()


def running(engine: PacedEngine, n: int) -> None:
  """`n` requests run and the engine has stopped at its hold: an abort or update asked for from now on
  meets them there, not while they still step."""
  wait_until(lambda: engine.stats()["running"] == n and engine.stopped.is_set())


class Call:
  """One /generate through the `sglang` backend on a thread of its own, streamed (as the shim's
  --incremental-stream asks) or not."""

  def __init__(self, url: str, ids: list[int], stream: bool):
    self.result: object = None
    self._thread = threading.Thread(target=lambda: asyncio.run(self._run(url, ids, stream)))
    self._thread.start()

  async def _run(self, url, ids, stream):
    backend = create_backend("sglang", url=url)
    try:
      call = (backend.generate_streaming(PromptIds(ids), PARAMS, lambda _: None) if stream
              else backend.generate(PromptIds(ids), PARAMS))
      self.result = await call
    except BackendError as e:
      self.result = e
    finally:
      await backend.close()

  def join(self):
    self._thread.join(timeout=120)
    assert not self._thread.is_alive()
    return self.result


def wait_until(condition, timeout_s: float = 60.0) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.002)


def session_config(tmp_path, url: str, push_mode: str):
  return train_config({
      "tasks": str(_task_dir(tmp_path)), "harnesses": ("mini",), "progress": False,
      "model": {"init": "test-tiny"},  # (the shim's template; the weights are the server's)
      "engine": {"backend": "sglang", "url": url, "export_dir": str(tmp_path / "export"), "push_mode": push_mode,
                 "options": {"admin_api_key": TOKEN}}})


@pytest.mark.parametrize("push_mode", ["drain", "abort"])
def test_a_push_while_one_call_runs_and_another_is_held(tmp_path, push_mode):
  """The trainer pushes new weights while one call streams and another arrives during the push. The push
  succeeds (a /flush_cache after SGLang's update would meet the held call running and get HTTP 400);
  the running call finishes on the old weights ("drain") or comes back aborted, retryable ("abort");
  the held one runs after the update, on the new weights, none of its prompt taken from a prefix the
  old weights cached."""
  old, new = tiny_model(0), tiny_model(3)
  ids = prompt(41, 60)
  with engine_server(old) as (url, server, engine), PolicySession(session_config(tmp_path, url, push_mode),
                                                                  tmp_path / "calls") as session:
    assert Call(url, ids, stream=False).join().policy_version is None  # its prefix is now cached
    engine.hold_after(2)  # the next call runs until told to go on
    first = Call(url, ids, stream=True)
    running(engine, 1)
    pushed = []
    push = threading.Thread(target=lambda: pushed.append(session.push(new, 1)))
    push.start()
    wait_until(lambda: server.update_lock.blocked)
    second = Call(url, ids, stream=False)
    wait_until(lambda: server.update_lock.held == 1)
    assert push.is_alive() and engine.stats()["running"] == 1  # held: not in the engine
    engine.go()
    push.join(timeout=120)
    first, second = first.join(), second.join()
  assert pushed == [1]
  if push_mode == "drain":  # the running call finished whole, on the weights it started with
    assert first.finish_reason == "length" and len(first.output_ids) == PARAMS.max_new_tokens
    assert first.policy_version is None
    np.testing.assert_allclose(first.output_logprobs, learner_logprobs(old, ids, first.output_ids, 1.0), atol=1e-4)
  else:  # ended at once: SGLang's abort event, a retryable error for the harness
    assert isinstance(first, BackendError) and first.status == 503 and "aborted" in str(first), first
  assert second.policy_version == 1 and second.cached_tokens == 0
  np.testing.assert_allclose(second.output_logprobs, learner_logprobs(new, ids, second.output_ids, 1.0), atol=1e-4)


def _post(url: str, body=None, token=TOKEN) -> tuple[int, str]:
  req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                               headers={"Content-Type": "application/json",
                                        **({"Authorization": f"Bearer {token}"} if token else {})})
  try:
    with urllib.request.urlopen(req, timeout=120) as resp:
      return resp.status, resp.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def _abort_all(url: str, server: EngineServer, engine: PacedEngine, weights) -> None:
  """An update with `abort_all_requests` while the engine is held; then the engine goes on."""
  update = threading.Thread(target=lambda: _post(url + "/update_weights_from_disk",
                                                 {"model_path": str(weights), "abort_all_requests": True}))
  update.start()
  wait_until(lambda: server.update_lock.blocked)
  engine.go()
  update.join(timeout=120)


def test_an_aborted_stream_and_call_are_retryable(tmp_path):
  """An update with `abort_all_requests` ends the calls in flight. The aborted stream's last event is
  SGLang's (--incremental-streaming-output): output_ids [the last token, sent already] beside the
  log-probs of every token; the client takes it for an abort (503, the harness retries), not for
  tokens that disagree (500). A plain call aborted likewise."""
  model = tiny_model(0)
  weights = hf_io.save(model, tmp_path / "weights")
  ids = prompt(42, 40)
  with engine_server(model) as (url, server, engine):
    # SGLang's abort event, as a raw client reads it.
    engine.hold_after(3)
    events = []

    def read_stream():
      req = urllib.request.Request(url + "/generate", data=json.dumps({
          "input_ids": ids, "stream": True, "return_logprob": True,
          "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}).encode())
      with urllib.request.urlopen(req, timeout=120) as resp:
        events.extend(json.loads(line[6:]) for line in resp if line.startswith(b"data: {"))

    reader = threading.Thread(target=read_stream)
    reader.start()
    running(engine, 1)
    _abort_all(url, server, engine, weights)
    reader.join(timeout=120)
    *tokens, last = events
    assert all(e["meta_info"]["finish_reason"] is None and len(e["output_ids"]) == 1 for e in tokens)
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and last["output_ids"] == tokens[-1]["output_ids"]
    pairs = last["meta_info"]["output_token_logprobs"]
    assert len(pairs) == last["meta_info"]["completion_tokens"] == len(tokens) > 1
    assert [t for _, t, _ in pairs] == [e["output_ids"][0] for e in tokens]

    # Through the client: the stream and a plain call, both aborted, both retryable.
    engine.hold_after(3)
    calls = [Call(url, ids, stream=True), Call(url, prompt(43, 40), stream=False)]
    running(engine, 2)
    _abort_all(url, server, engine, weights)
    for call in calls:
      e = call.join()
      assert isinstance(e, BackendError) and e.status == 503 and "aborted" in str(e), e


def test_flush_cache_only_of_an_idle_engine():
  """SGLang's /flush_cache: HTTP 400 "Flush cache failed." while a request runs; with ?timeout=S it
  waits up to S seconds for the engine to go idle (400 "Timed out waiting for idle state." after);
  an idle engine is flushed (200)."""
  with engine_server(tiny_model(0)) as (url, server, engine):
    engine.hold_after(1)
    call = Call(url, prompt(44, 30), stream=False)
    running(engine, 1)
    assert _post(url + "/flush_cache") == (400, FLUSH_FAILED)
    start = time.monotonic()
    assert _post(url + "/flush_cache?timeout=0.2") == (400, FLUSH_TIMED_OUT)
    assert time.monotonic() - start >= 0.2
    flushed = []
    flush = threading.Thread(target=lambda: flushed.append(_post(url + "/flush_cache?timeout=60")))
    flush.start()
    time.sleep(0.1)
    assert not flushed  # waiting for idle
    engine.go()
    flush.join(timeout=120)
    assert flushed[0][0] == 200 and flushed[0][1].startswith("Cache flushed.")
    assert call.join().finish_reason == "length"
    assert _post(url + "/flush_cache")[0] == 200
    assert _post(url + "/flush_cache?timeout=-1")[0] == 422
    assert _post(url + "/flush_cache", token=None)[0] == 401


def test_abort_all_ends_the_queued_and_the_running_requests(model):
  """`Engine.abort_all` (what `abort_all_requests` asks): SGLang aborts its waiting queue as well as the
  running batch; requests submitted afterwards run normally."""
  engine = PacedEngine(model, SMALL)
  try:
    engine.hold_after(0)
    futures = engine.submit_batch([(prompt(50 + i, 20), PARAMS) for i in range(SMALL.max_slots + 1)])
    running(engine, SMALL.max_slots)
    assert engine.stats()["queued"] == 1
    engine.abort_all()
    engine.go()
    results = [f.result(timeout=60) for f in futures]
    assert [r.finish_reason for r in results] == ["abort"] * len(futures)
    assert all(r.output_ids for r in results[:-1]) and results[-1].output_ids == ()
    assert engine.submit(prompt(49, 20), PARAMS).result(timeout=60).finish_reason == "length"
  finally:
    engine.go()
    engine.close()
