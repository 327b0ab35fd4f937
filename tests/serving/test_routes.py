"""Routed experts from the remote engines (SGLang's base64 int32 meta_info, streamed on the last chunk;
vLLM's base64 .npy choice field) through the shim, with the official SDK, into the call log: each call
asks only for the positions past what the log holds, stores only those, and the log rebuilds every call's
routes at every position it computed."""
import asyncio
import base64
import io
import json

import anthropic
import numpy as np
import pytest
from aiohttp import web

from clawjax.calllog import ROUTES_SUFFIX
from clawjax.generation import SamplingParams
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend
from clawjax.serving.backends.routes import sglang_routes
from clawjax.serving.backends.scripted import ScriptedBackend

from tests.serving.helpers import FINAL_TURN, WRITE_TURN, log_calls
from tests.serving.test_backends import EngineServer, vllm_routes
from tests.serving.test_sglang_stream import chunk, event

LAYERS, TOP_K, EXPERTS = 3, 2, 128


def engine_routes(seq, start):
  """The stand-in engine's routes of positions [start, len(seq) - 1): a function of the token and its
  position, distinct within a token's top_k."""
  p = np.arange(start, len(seq) - 1)[:, None, None]
  tok = np.asarray(seq[start:len(seq) - 1])[:, None, None]
  layer, choice = np.arange(LAYERS)[None, :, None], np.arange(TOP_K)[None, None, :]
  return ((tok * 31 + p * 7 + layer * 13) % EXPERTS + choice) % EXPERTS


def sglang_with_routes(policy, seen, *, flag=True, per_chunk=4):
  """SGLang's /generate (whole or streamed incrementally) with the scripted policy; started with
  `--enable-return-routed-experts` when `flag`: routes on the answer's (the last chunk's) meta_info."""

  async def generate(request):
    body = await request.json()
    seen.append(body)
    sp = body["sampling_params"]
    gen = await policy.generate(PromptIds(body["input_ids"]), SamplingParams(
        max_new_tokens=sp["max_new_tokens"], stop_token_ids=tuple(sp["stop_token_ids"])))
    ids, logprobs = list(gen.output_ids), list(gen.output_logprobs)
    last = chunk(ids, logprobs, {"type": gen.finish_reason}, len(ids), len(body["input_ids"]))
    if flag and body.get("return_routed_experts"):
      routes = engine_routes(body["input_ids"] + ids, body.get("routed_experts_start_len", 0))
      last["meta_info"]["routed_experts"] = base64.b64encode(routes.astype("<i4").tobytes()).decode()
    if not body.get("stream"):
      return web.json_response(last)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for start in range(0, len(ids) - per_chunk, per_chunk):
      await resp.write(event(chunk(ids[start:start + per_chunk], logprobs[start:start + per_chunk], None,
                                   start + per_chunk, len(body["input_ids"]))))
    done = (len(ids) - 1) // per_chunk * per_chunk
    last["output_ids"] = ids[done:]
    last["meta_info"]["output_token_logprobs"] = last["meta_info"]["output_token_logprobs"][done:]
    await resp.write(event(last) + b"data: [DONE]\n\n")
    return resp

  return {("POST", "/generate"): generate}


def vllm_with_routes(policy, seen):
  """vLLM's /v1/completions started with `--enable-return-routed-experts`: a .npy of uint8 routes."""
  routes = vllm_routes(policy, seen)
  whole = routes[("POST", "/v1/completions")]

  async def completions(request):
    answer = json.loads((await whole(request)).body)
    body, choice = seen[-1], answer["choices"][0]
    out = io.BytesIO()
    np.save(out, engine_routes(body["prompt"] + choice["token_ids"],
                               body.get("routed_experts_prompt_start", 0)).astype(np.uint8))
    choice["routed_experts"] = base64.b64encode(out.getvalue()).decode()
    return web.json_response(answer)

  routes[("POST", "/v1/completions")] = completions
  return routes


def agent_rollout(client, calls):
  """`calls` Anthropic calls as Claude Code makes them: each a tool call echoed back with its tool_result
  (the last one answers)."""
  tools = [{"name": "write_file", "input_schema": {"type": "object"}}]
  msgs = [{"role": "user", "content": "go"}]
  for _ in range(calls - 1):
    reply = client.messages.create(model="m", max_tokens=1000, messages=msgs, tools=tools)
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[-1].id,
                                           "content": "ok"}]}]
  return client.messages.create(model="m", max_tokens=1000, messages=msgs, tools=tools)


def shim_rollout(make_shim, template, name, routes_of, calls, stream=False, routed_experts=TOP_K):
  policy, seen = ScriptedBackend(template, [WRITE_TURN] * (calls - 1) + [FINAL_TURN]), []
  with EngineServer(routes_of(policy, seen)) as engine:
    backend = create_backend(name, url=engine.url, model="qwen3", routed_experts=routed_experts)
    shim = make_shim(None, backend=backend, max_new_tokens=300, incremental_stream=stream)
    r = shim.create_rollout("t", "claude_code")
    client = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
    if stream:
      with client.messages.stream(model="m", max_tokens=1000, messages=[{"role": "user", "content": "go"}]) as s:
        s.get_final_message()
    else:
      agent_rollout(client, calls)
  return log_calls(r["log_path"]), seen, r["log_path"]


@pytest.mark.parametrize("name,routes_of", [("sglang", sglang_with_routes), ("vllm", vllm_with_routes)])
def test_each_call_logs_the_routes_past_its_prefix_and_loads_them_whole(make_shim, template, name, routes_of):
  calls, seen, log_path = shim_rollout(make_shim, template, name, routes_of, calls=8)
  assert len(calls) == 8 and all(c.status == "ok" for c in calls)
  start_field = "routed_experts_start_len" if name == "sglang" else "routed_experts_prompt_start"
  starts = [body[start_field] for body in seen]
  assert starts[0] == 0
  for c, start in zip(calls, starts):
    seq = c.input_ids + c.output_ids
    r = c.routed_experts
    assert r.start == start and r.first == 0 and r.end == len(seq) - 1
    assert np.array_equal(r.full(), engine_routes(seq, 0)) and r.full().dtype == np.uint8
  for prev, c, start in zip(calls, calls[1:], starts[1:]):
    # Each call refers to the one before, whose routes end one short of its input + output.
    assert start == len(prev.input_ids) + len(prev.output_ids) - 1 and c.routed_experts.before == prev.routed_experts
  # Every position of the rollout is stored once: the last call's sequence less its last token.
  unique = len(calls[-1].input_ids) + len(calls[-1].output_ids) - 1
  with open(log_path + ROUTES_SUFFIX, "rb") as f:
    assert len(f.read()) == unique * LAYERS * TOP_K


def test_sglang_stream_carries_routes_on_its_last_chunk(make_shim, template):
  (call,), (body,), _ = shim_rollout(make_shim, template, "sglang", sglang_with_routes, calls=1, stream=True)
  assert body["stream"] is True and body["return_routed_experts"] is True
  assert np.array_equal(call.routed_experts.full(), engine_routes(call.input_ids + call.output_ids, 0))


@pytest.mark.parametrize("routed_experts,flag", [(0, True), (TOP_K, False)])
def test_no_routes_asked_or_given_logs_none_and_fails_nothing(make_shim, template, routed_experts, flag):
  routes_of = lambda policy, seen: sglang_with_routes(policy, seen, flag=flag)
  calls, seen, _ = shim_rollout(make_shim, template, "sglang", routes_of, calls=2, routed_experts=routed_experts)
  assert [c.status for c in calls] == ["ok", "ok"] and all(c.routed_experts is None for c in calls)
  assert ("return_routed_experts" in seen[0]) == bool(routed_experts)


@pytest.mark.parametrize("value", ["not base64!", base64.b64encode(b"\0" * 10).decode(), 7])
def test_undecodable_sglang_routes_are_a_backend_error(value):
  with pytest.raises(BackendError, match="routed_experts"):
    sglang_routes({"routed_experts": value}, 0, 5, TOP_K)


def test_sglang_routes_keep_every_layer_the_engine_gives():
  ids = engine_routes(list(range(6)), 2)
  routes = sglang_routes({"routed_experts": base64.b64encode(ids.astype("<i4").tobytes()).decode()}, 2, 5, TOP_K)
  assert routes.start == 2 and routes.shape == (LAYERS, TOP_K) and np.array_equal(routes.ids_PLK, ids)
