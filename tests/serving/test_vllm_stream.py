"""`VLLMBackend.generate_streaming` against a stand-in vLLM /v1/completions that streams a scripted turn
as vLLM does with `return_token_ids` (chunks of new tokens, a usage chunk, `data: [DONE]`), and through
the shim with --incremental-stream and the official SDK."""
import asyncio
import json

import anthropic
import pytest
from aiohttp import web

from clawjax.generation import SamplingParams
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend
from clawjax.serving.backends.scripted import ScriptedBackend, turn_ids

from tests.serving.helpers import WRITE_TURN, log_calls
from tests.serving.test_backends import EngineServer, vllm_routes

PROMPT = PromptIds([151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198])
PARAMS = SamplingParams(max_new_tokens=300, stop_token_ids=(151645,))


def vllm_stream_routes(policy, seen, per_chunk=4, tamper=None):
  """vllm_routes, plus `stream: true`: `per_chunk` new tokens per chunk; `tamper(k, chunk)` rewrites
  chunk k (None drops it)."""
  routes = vllm_routes(policy, seen)
  whole = routes[("POST", "/v1/completions")]

  async def completions(request):
    body = await request.json()
    if not body.get("stream"):
      return await whole(request)
    seen.append(body)
    gen = await policy.generate(PromptIds(body["prompt"]), SamplingParams(
        max_new_tokens=body["max_tokens"], stop_token_ids=tuple(body["stop_token_ids"])))
    ids, logprobs = list(gen.output_ids), list(gen.output_logprobs)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    starts = range(0, len(ids), per_chunk)
    for k, i in enumerate(starts):
      out = {"id": "cmpl-1", "object": "text_completion", "choices": [{
          "index": 0, "text": "", "token_ids": ids[i:i + per_chunk],
          "logprobs": {"tokens": [], "token_logprobs": logprobs[i:i + per_chunk], "top_logprobs": []},
          "finish_reason": gen.finish_reason if k == len(starts) - 1 else None}]}
      out = tamper(k, out) if tamper else out
      if out is not None:
        await resp.write(b"data: " + json.dumps(out).encode() + b"\n\n")
        await asyncio.sleep(0.005)
    await resp.write(b'data: {"id": "cmpl-1", "choices": [], "usage": {"completion_tokens": %d}}\n\n'
                     b"data: [DONE]\n\n" % len(ids))
    return resp

  routes[("POST", "/v1/completions")] = completions
  return routes


def stream(template, **kwargs):
  calls, seen = [], []

  async def run(url):
    backend = create_backend("vllm", url=url)
    try:
      return (await backend.generate_streaming(PROMPT, PARAMS, lambda ids: calls.append(list(ids))),
              await backend.generate(PROMPT, PARAMS))
    finally:
      await backend.close()

  with EngineServer(vllm_stream_routes(ScriptedBackend(template, [WRITE_TURN]), seen, **kwargs)) as s:
    return (calls, seen, *asyncio.run(run(s.url)))


def test_stream_delivers_the_turn_as_generate_would(template):
  calls, seen, gen, plain = stream(template)
  expected = turn_ids(template, WRITE_TURN)
  assert len(calls) > 1 and [t for c in calls for t in c] == list(gen.output_ids) == expected
  assert gen == plain
  streamed, generated = seen
  assert streamed.pop("stream") is True and streamed.pop("stream_options") == {"include_usage": True}
  assert streamed == generated


@pytest.mark.parametrize("tamper, match, status", [
    (lambda k, c: None if k == 2 else c, "usage counts", 503),  # A chunk lost on the way.
    (lambda k, c: {"object": "error", "message": "engine died"} if k == 1 else c, "engine died", 500),
    (lambda k, c: dict(c, choices=[dict(c["choices"][0], finish_reason=None)]), "without finishing",
     503),
    (lambda k, c: dict(c, choices=[dict(c["choices"][0],
                                         token_ids=[-1] + c["choices"][0]["token_ids"][1:])])
     if k == 1 else c, r"output_ids\[4\] is -1", 500),
])
def test_broken_streams_are_backend_errors(template, tamper, match, status):
  with pytest.raises(BackendError, match=match) as e:
    stream(template, tamper=tamper)
  assert e.value.status == status


def test_shim_streams_text_from_vllm(make_shim, template):
  seen = []
  with EngineServer(vllm_stream_routes(ScriptedBackend(template, [WRITE_TURN]), seen)) as engine:
    shim = make_shim(None, backend=create_backend("vllm", url=engine.url), incremental_stream=True)
    rollout = shim.create_rollout("t", "claude_code")
    c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
    with c.messages.stream(model="m", max_tokens=100,
                           messages=[{"role": "user", "content": "go"}]) as s:
      deltas = [e.delta.text for e in s
                if e.type == "content_block_delta" and e.delta.type == "text_delta"]
      reply = s.get_final_message()
  assert len(deltas) > 1 and "".join(deltas) == WRITE_TURN.text == reply.content[1].text
  assert seen[0]["stream"] is True
  assert list(log_calls(rollout["log_path"])[0].output_ids) == turn_ids(template, WRITE_TURN)
