"""`SGLangBackend.generate_streaming` against a stand-in SGLang server that streams a scripted turn the
way SGLang does (`data: {chunk}` events, `data: [DONE]`), in both its cumulative and incremental modes,
and the ways such a stream goes wrong."""
import asyncio
import json
import threading

import pytest
from aiohttp import web

from clawjax.generation import SamplingParams
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend
from clawjax.serving.backends.http import sse_data
from clawjax.serving.backends.scripted import ScriptedBackend, scripted_logprob, turn_ids

from tests.serving.helpers import WRITE_TURN
from tests.serving.test_backends import EngineServer

PROMPT = PromptIds([151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198])
PARAMS = SamplingParams(max_new_tokens=300, temperature=0.7, top_p=0.9, top_k=40,
                        stop_token_ids=(151645,), seed=11)


def chunk(ids, logprobs, finish, total, prompt_tokens):
  return {"text": "", "output_ids": list(ids), "meta_info": {
      "id": "req-1", "finish_reason": finish, "prompt_tokens": prompt_tokens,
      "completion_tokens": total, "weight_version": "7",
      "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)]}}


def event(obj):
  # `json`, which writes a NaN log-prob as the NaN literal (orjson, SGLang's encoder, writes null).
  return b"data: " + json.dumps(obj).encode() + b"\n\n"


class StreamingSGLang:
  """SGLang's /generate with the scripted policy as the model. `stream: true` answers an event stream
  of `per_chunk` tokens per chunk (one empty step after the first chunk), cumulative or incremental per
  `mode`; `tamper(k, chunk) -> chunk | bytes` rewrites chunk k (bytes are sent as they are). `gate`,
  when given, is waited on (2 s at most) before the last chunk goes out."""

  def __init__(self, policy, mode="cumulative", per_chunk=3, tamper=None, gate=None, status=None):
    self.policy, self.mode, self.per_chunk = policy, mode, per_chunk
    self.tamper, self.gate, self.status = tamper, gate, status
    self.seen, self.gate_open_before_last = [], None

  async def generate(self, request):
    body = await request.json()
    self.seen.append(body)
    if self.status:
      return web.json_response({"error": {"message": "overloaded"}}, status=self.status)
    sp = body["sampling_params"]
    gen = await self.policy.generate(PromptIds(body["input_ids"]), SamplingParams(
        max_new_tokens=sp["max_new_tokens"], stop_token_ids=tuple(sp["stop_token_ids"])))
    ids, logprobs, finish = list(gen.output_ids), list(gen.output_logprobs), gen.finish_reason
    if not body.get("stream"):
      return web.json_response(chunk(ids, logprobs, {"type": finish}, len(ids), len(body["input_ids"])))
    ends = list(range(self.per_chunk, len(ids), self.per_chunk)) + [len(ids)]
    ends.insert(1, ends[0])  # A step that sampled nothing new.
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for k, end in enumerate(ends):
      start = 0 if self.mode == "cumulative" else (ends[k - 1] if k else 0)
      last = k == len(ends) - 1
      out = chunk(ids[start:end], logprobs[start:end], {"type": finish} if last else None, end,
                  len(body["input_ids"]))
      if self.tamper:
        out = self.tamper(k, out)
      if last and self.gate is not None:
        self.gate_open_before_last = await asyncio.get_running_loop().run_in_executor(
            None, self.gate.wait, 2.0)
      await resp.write(out if isinstance(out, bytes) else event(out))
    await resp.write(b"data: [DONE]\n\n")
    return resp

  def routes(self):
    return {("POST", "/generate"): self.generate}


def stream(server, params=PARAMS, also_generate=False, calls=None):
  """(ids given to on_tokens per call (also appended to `calls`), the streamed Generation[, a plain
  generate's Generation])."""
  calls = [] if calls is None else calls

  def on_tokens(new_ids):
    calls.append(list(new_ids))
    if server.gate is not None:
      server.gate.set()

  async def run(url):
    backend = create_backend("sglang", url=url, model="qwen3")
    try:
      gen = await backend.generate_streaming(PROMPT, params, on_tokens)
      return (calls, gen, await backend.generate(PROMPT, params)) if also_generate else (calls, gen)
    finally:
      await backend.close()

  with EngineServer(server.routes()) as engine:
    return asyncio.run(run(engine.url))


def failure(server, **kwargs):
  with pytest.raises(BackendError) as e:
    stream(server, **kwargs)
  return e.value


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_stream_delivers_the_turn_as_generate_would(template, mode):
  server = StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), mode, gate=threading.Event())
  calls, gen, plain = stream(server, also_generate=True)
  expected = turn_ids(template, WRITE_TURN)
  assert len(calls) == -(-len(expected) // 3) > 1 and all(calls)
  assert server.gate_open_before_last  # Tokens reached on_tokens before the last chunk was sent.
  assert [t for c in calls for t in c] == list(gen.output_ids) == list(plain.output_ids) == expected
  assert gen.output_logprobs == plain.output_logprobs == pytest.approx(
      [scripted_logprob(len(PROMPT.ids) + i, t) for i, t in enumerate(expected)])
  assert gen.finish_reason == plain.finish_reason == "stop" and gen.policy_version == 7
  streamed, generated = server.seen
  assert streamed.pop("stream") is True and "stream" not in generated
  assert streamed == generated and generated["input_ids"] == list(PROMPT.ids)
  assert generated["sampling_params"] == {
      "max_new_tokens": 300, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop_token_ids": [151645],
      "skip_special_tokens": False, "no_stop_trim": True, "sampling_seed": 11}


def test_length_finish_and_abort(template):
  params = SamplingParams(max_new_tokens=7, stop_token_ids=(151645,))
  calls, gen = stream(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN])), params=params)
  assert gen.finish_reason == "length" and [len(c) for c in calls] == [3, 3, 1]
  assert list(gen.output_ids) == turn_ids(template, WRITE_TURN)[:7]

  def abort(k, out):
    if out["meta_info"]["finish_reason"]:
      out["meta_info"]["finish_reason"] = {"type": "abort", "message": "weights are being updated"}
    return out

  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), tamper=abort))
  assert e.status == 503 and "weights are being updated" in str(e)

  # An abort SGLang gives a client-error status (a request it refuses, FINISH_ABORT(message, 400)):
  # retrying cannot help, so it is not retryable.
  def refused(k, out):
    if out["meta_info"]["finish_reason"]:
      out["meta_info"]["finish_reason"] = {"type": "abort", "message": "input is too long",
                                           "status_code": 400, "err_type": "BadRequestError"}
    return out

  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), tamper=refused))
  assert e.status == 500 and "HTTP 400" in str(e) and "input is too long" in str(e)


def test_error_chunk_mid_stream_names_the_message(template):
  tamper = lambda k, out: {"error": {"message": "CUDA out of memory"}} if k == 3 else out
  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), "incremental", tamper=tamper))
  assert e.status == 500 and "CUDA out of memory" in str(e)


@pytest.mark.parametrize("how", ["dropped", "no_finish"])
def test_stream_cut_short_is_retryable(template, how):

  def tamper(k, out):
    if how == "dropped" and k == 3:
      return event(out)[:40]  # Half an event, then the connection goes.
    if how == "dropped" and k == 4:
      raise ConnectionResetError("engine died")
    out["meta_info"]["finish_reason"] = None
    return out

  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), tamper=tamper))
  assert e.status == 503 and ("without finishing" in str(e)) == (how == "no_finish")


def test_http_error_before_the_stream(template):
  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), status=503))
  assert e.status == 503 and e.overloaded and "HTTP 503" in str(e)
  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), status=400))
  assert e.status == 500 and "HTTP 400" in str(e)


def test_cumulative_chunk_that_rewrites_the_past(template):

  def tamper(k, out):
    if k == 3:
      out["output_ids"][1] += 1
      out["meta_info"]["output_token_logprobs"][1][1] += 1
    return out

  calls = []
  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), tamper=tamper), calls=calls)
  assert e.status == 500 and "disagrees" in str(e) and "output_ids[1]" in str(e)
  assert sum(map(len, calls)) == 6  # The first two chunks went out; nothing after the bad one.


@pytest.mark.parametrize("bad", [float("nan"), None])
def test_bad_logprob_in_a_chunk(template, bad):
  # The NaN literal (Python's json) or null (orjson, SGLang's own encoder, writes NaN so).

  def tamper(k, out):
    if k == 2:
      out["meta_info"]["output_token_logprobs"][0][0] = bad
    return out

  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), "incremental", tamper=tamper))
  assert e.status == 500 and "output_logprobs[3]" in str(e)


def test_bad_token_id_never_reaches_on_tokens(template):

  def tamper(k, out):
    if k == 2:
      out["output_ids"][0] = out["meta_info"]["output_token_logprobs"][0][1] = -5
    return out

  calls = []
  e = failure(StreamingSGLang(ScriptedBackend(template, [WRITE_TURN]), "incremental", tamper=tamper),
              calls=calls)
  assert e.status == 500 and "output_ids[3] is -5" in str(e)
  assert sum(map(len, calls)) == 3


@pytest.mark.parametrize("n", [8000, 24000])
def test_large_cumulative_chunk(n):
  # A cumulative chunk late in a long turn is one line of hundreds of KB: past the longest line
  # aiohttp's readline takes (twice its read buffer: 128 KiB in older versions, 512 KiB in 3.14).
  ids = [(i * 7919) % 150000 for i in range(n)]
  logprobs = [scripted_logprob(i, t) for i, t in enumerate(ids)]
  sent = event(chunk(ids, logprobs, {"type": "length"}, len(ids), len(PROMPT.ids)))
  assert len(sent) > (2**17 if n == 8000 else 2**19)

  async def generate(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(event(chunk(ids[:5], logprobs[:5], None, 5, len(PROMPT.ids))))
    await resp.write(sent)
    await resp.write(b"data: [DONE]\n\n")
    return resp

  calls = []

  async def run(url):
    backend = create_backend("sglang", url=url, model="qwen3")
    try:
      return await backend.generate_streaming(PROMPT, PARAMS, calls.append)
    finally:
      await backend.close()

  with EngineServer({("POST", "/generate"): generate}) as engine:
    gen = asyncio.run(run(engine.url))
  assert [len(c) for c in calls] == [5, n - 5]
  assert list(gen.output_ids) == ids and list(gen.output_logprobs) == logprobs
  assert gen.finish_reason == "length"


class Blocks:
  """A stand-in for aiohttp's StreamReader: `iter_any` yields `data` in blocks of `size` bytes."""

  def __init__(self, data, size):
    self.data, self.size = data, size

  async def iter_any(self):
    for i in range(0, len(self.data), self.size):
      yield self.data[i:i + self.size]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_sse_events_split_anywhere(size):
  wire = (b": keep-alive\n\ndata: {\"a\": 1}\n\nevent: x\r\ndata: [1,\r\ndata: 2]\r\n\r\n\n"
          b"data:{\"b\":2}\n\ndata: [DONE]\n\ndata: {\"c\"")

  async def events():
    return [bytes(e) async for e in sse_data(Blocks(wire, size))]

  assert asyncio.run(events()) == [b'{"a": 1}', b"[1,\n2]", b'{"b":2}', b"[DONE]"]
