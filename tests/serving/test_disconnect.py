"""A client that leaves mid-stream, through the shim over the embedded engine: the shim cancels the call's
generation (nobody would read it; the harness retries), the engine drops it at its next step and gives its
slot to the next call, and the call is logged as an `error` record that says so."""
import asyncio
import time

import aiohttp
import anthropic
from flax import nnx

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.generation import SamplingParams
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from clawjax.serving.backends.embedded import EmbeddedBackend
from clawjax.serving.server import CLIENT_CLOSED
from tests.engine.conftest import Parker
from tests.serving.helpers import log_calls

MESSAGES = [{"role": "user", "content": "go"}]
MAX_TOKENS = 150


def _calls(path, n: int, timeout_s: float) -> list:
  """The log's calls once it holds n (or what it holds after timeout_s)."""
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      calls = log_calls(path)
    except OSError:
      calls = []
    if len(calls) >= n or time.monotonic() > deadline:
      return calls
    time.sleep(0.05)


def test_a_client_that_leaves_mid_stream_frees_its_engine_slot(make_shim):
  # Two slots: the stream's, and a companion request's that parks the engine while the stream's generation is
  # in its slot (so the client leaves mid-generation, whatever the machine's speed).
  engine = Engine(Decoder(preset("test-tiny"), rngs=nnx.Rngs(0)),
                  EngineConfig(max_slots=2, max_seq_len=256, prefill_chunk=64, min_bucket=64))
  try:
    shim = make_shim(None, backend=EmbeddedBackend(engine, owns_engine=False), keepalive_s=0.05,
                     max_new_tokens=MAX_TOKENS)
    rollout = shim.create_rollout("t", "claude_code")
    parker = Parker(engine, running=2, sampling=SamplingParams(max_new_tokens=200, temperature=0.0))

    async def leave_mid_stream() -> bytes:
      async with aiohttp.ClientSession() as session:
        async with session.post(rollout["base_url"] + "/v1/messages", headers={"x-api-key": rollout["api_key"]},
                                json={"model": "m", "max_tokens": MAX_TOKENS, "stream": True,
                                      "messages": MESSAGES}) as resp:
          assert resp.status == 200
          head = await resp.content.readany()
          assert await asyncio.to_thread(parker.parked.wait, 120)
          resp.close()  # mid-stream: the connection goes
          return head

    assert b"message_start" in asyncio.run(leave_mid_stream())
    # The shim finds the client gone at its next keep-alive and cancels the generation: its record is
    # written while the engine is still parked.
    calls = _calls(rollout["log_path"], 1, 20)
    parker.release()
    assert len(calls) == 1 and calls[0].status == "error", calls
    assert calls[0].extra["client_disconnected"] and calls[0].extra["backend_status"] == CLIENT_CLOSED
    parker.future.result(timeout=120)

    # The next call (the harness's retry) reuses the freed slot and the prefix the stream left there.
    c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    reply = c.messages.create(model="m", max_tokens=MAX_TOKENS, messages=MESSAGES)
    assert reply.usage.output_tokens > 0
    _, retry = log_calls(rollout["log_path"])
    assert retry.status == "ok" and retry.input_ids == calls[0].input_ids
    assert retry.extra["cached_tokens"] == len(retry.input_ids) - 1
    # The stream decoded at most the parked dispatch's run (16 tokens) beyond its first token.
    stats = engine.stats()
    assert engine.alive and stats["running"] == 0
    assert stats["tokens_decoded"] <= 199 + len(retry.output_ids) - 1 + 16, stats
  finally:
    engine.close()
