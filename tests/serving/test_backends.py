"""The HTTP backends against minimal servers speaking the engines' documented wire formats, with the
scripted policy behind them; the registry; role profiles."""
import asyncio
import dataclasses
import json
import threading

import anthropic
import pytest
from aiohttp import web

from clawjax.generation import Generation, SamplingParams
from clawjax.serving.backends.base import (Backend, BackendError, PromptIds, backend_names, create_backend,
                                           register_backend)
from clawjax.serving.backends.scripted import ScriptedBackend, scripted_logprob, turn_ids
from clawjax.serving.chat import ChatRequest
from clawjax.serving.profiles import PROFILES, HarnessProfile, RoleRule, profile_for
from clawjax.text.messages import Message, ToolSpec

from tests.serving.helpers import (FINAL_TURN, WRITE_TURN, assert_linear_zero_drift, echo_tool_call_round,
                                  log_calls)


class EngineServer:
  """An aiohttp server on its own thread; `routes` maps (method, path) to async handlers, added to `app`
  (a new one when not given)."""

  def __init__(self, routes, app: web.Application | None = None):
    self.loop = asyncio.new_event_loop()
    self.app = app or web.Application()
    for (method, path), handler in routes.items():
      self.app.router.add_route(method, path, handler)
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.seen = []

  def __enter__(self):
    self.thread.start()

    async def start():
      self.runner = web.AppRunner(self.app)
      await self.runner.setup()
      site = web.TCPSite(self.runner, "127.0.0.1", 0)
      await site.start()
      return self.runner.addresses[0][1]

    self.url = f"http://127.0.0.1:{asyncio.run_coroutine_threadsafe(start(), self.loop).result()}"
    return self

  def __exit__(self, *exc):
    asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join()


def sglang_routes(policy: ScriptedBackend, seen: list, fail_status=None,
                  info_paths=("/model_info", "/get_model_info"), updates=None):
  """SGLang's native /generate protocol with the scripted policy as the model; the model info at
  `info_paths` (SGLang 0.5.23 answers both; servers before it only /get_model_info). The bodies of the
  weight updates go to `updates`."""
  updates = [] if updates is None else updates

  async def generate(request):
    body = await request.json()
    seen.append(body)
    if fail_status:
      return web.json_response({"error": "busy"}, status=fail_status)
    sp = body["sampling_params"]
    gen = await policy.generate(PromptIds(body["input_ids"]), SamplingParams(
        max_new_tokens=sp["max_new_tokens"], stop_token_ids=tuple(sp["stop_token_ids"])))
    return web.json_response({
        "text": "", "output_ids": list(gen.output_ids),
        "meta_info": {"output_token_logprobs": [[lp, t, None] for lp, t in
                                                zip(gen.output_logprobs, gen.output_ids)],
                      "finish_reason": {"type": gen.finish_reason},
                      "prompt_tokens": len(body["input_ids"]),
                      "completion_tokens": len(gen.output_ids)}})

  async def ok(request):
    seen.append(request.path)
    return web.json_response({"success": True, "message": ""})

  async def update(request):
    seen.append(request.path)
    updates.append(await request.json())
    version.append(updates[-1]["weight_version"])
    return web.json_response({"success": True, "message": ""})

  async def model_info(request):
    seen.append(request.path)
    return web.json_response({"model_path": "m", "weight_version": version[-1]})

  version = ["default"]  # SGLang's weight_version before any update
  return {("POST", "/generate"): generate, ("GET", "/health"): ok, ("POST", "/flush_cache"): ok,
          ("POST", "/update_weights_from_disk"): update, **{("GET", path): model_info for path in info_paths}}


def vllm_routes(policy: ScriptedBackend, seen: list, max_model_len: int | None = None):
  """vLLM's /v1/completions with a token-id prompt and return_token_ids; /v1/models lists
  `max_model_len` when given (vLLM's --max-model-len), and prompts + max_tokens past it get vLLM's
  400, as the real server answers."""

  async def completions(request):
    body = await request.json()
    seen.append(body)
    if max_model_len is not None and len(body["prompt"]) + body["max_tokens"] > max_model_len:
      return web.json_response({"object": "error", "type": "BadRequestError", "code": 400,
                                "message": "This model's maximum context length is "
                                           f"{max_model_len} tokens."}, status=400)
    gen = await policy.generate(PromptIds(body["prompt"]), SamplingParams(
        max_new_tokens=body["max_tokens"], stop_token_ids=tuple(body["stop_token_ids"])))
    return web.json_response({"choices": [{
        "index": 0, "text": "", "token_ids": list(gen.output_ids),
        "prompt_token_ids": body["prompt"], "finish_reason": gen.finish_reason,
        "logprobs": {"token_logprobs": list(gen.output_logprobs), "tokens": [], "top_logprobs": []}}]})

  async def models(request):
    card = {"id": "served-policy"} | ({"max_model_len": max_model_len} if max_model_len else {})
    return web.json_response({"data": [card]})

  async def health(request):
    return web.Response()

  return {("POST", "/v1/completions"): completions, ("GET", "/v1/models"): models,
          ("GET", "/health"): health}


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_http_backend_round_trip_through_the_shim(make_shim, template, name):
  policy = ScriptedBackend(template, [WRITE_TURN, FINAL_TURN])
  seen = []
  routes = sglang_routes(policy, seen) if name == "sglang" else vllm_routes(policy, seen)
  with EngineServer(routes) as engine:
    backend = create_backend(name, url=engine.url, model="qwen3")
    shim = make_shim(None, backend=backend, max_new_tokens=300, temperature=0.7)
    r = shim.create_rollout("t", "claude_code")
    c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
    assert echo_tool_call_round(c, max_tokens=1000).content[0].text == FINAL_TURN.text
    calls = assert_linear_zero_drift(r["log_path"], 2)
    assert list(calls[0].output_ids) == turn_ids(template, WRITE_TURN)
    assert list(calls[0].output_logprobs) == pytest.approx(
        [scripted_logprob(len(calls[0].input_ids) + i, t) for i, t in enumerate(calls[0].output_ids)])
    prompt_key = "input_ids" if name == "sglang" else "prompt"
    assert [b[prompt_key] for b in seen] == [list(c.input_ids) for c in calls]
    sampling = seen[0]["sampling_params"] if name == "sglang" else seen[0]
    assert sampling["temperature"] == 0.7
    assert sampling["stop_token_ids"] == list(template.stop_token_ids)
    if name == "sglang":
      assert seen[0]["return_logprob"] is True and sampling["max_new_tokens"] == 300
    else:
      assert seen[0]["model"] == "served-policy" and seen[0]["return_token_ids"] is True


@pytest.mark.parametrize("field", ["output_logprobs", "output_ids"])
def test_engine_answer_that_fails_validation_is_a_backend_error(make_shim, template, field):
  # The first answer carries a NaN log-prob (a JSON NaN literal) or a negative token id: the client
  # gets the API's 500, the log an error record naming the field, and the next call goes through.
  policy, answers = ScriptedBackend(template, [FINAL_TURN]), []

  async def generate(request):
    body = await request.json()
    sp = body["sampling_params"]
    gen = await policy.generate(PromptIds(body["input_ids"]), SamplingParams(
        max_new_tokens=sp["max_new_tokens"], stop_token_ids=tuple(sp["stop_token_ids"])))
    pairs = [[lp, t, None] for lp, t in zip(gen.output_logprobs, gen.output_ids)]
    if not answers:
      pairs[1][0 if field == "output_logprobs" else 1] = float("nan") if field == "output_logprobs" else -5
    answers.append(pairs)
    return web.Response(text=json.dumps({"output_ids": [p[1] for p in pairs], "meta_info": {
        "output_token_logprobs": pairs, "finish_reason": {"type": gen.finish_reason}}}),
        content_type="application/json")

  with EngineServer({("POST", "/generate"): generate}) as engine:
    shim = make_shim(None, backend=create_backend("sglang", url=engine.url, model="qwen3"))
    r = shim.create_rollout("t", "claude_code")
    c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
    kwargs = dict(model="m", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.InternalServerError) as e:
      c.messages.create(**kwargs)
    assert f"{field}[1]" in str(e.value)
    assert c.messages.create(**kwargs).content[0].text == FINAL_TURN.text
  calls = log_calls(r["log_path"])
  assert [call.status for call in calls] == ["error", "ok"] and f"{field}[1]" in calls[0].extra["error"]


@pytest.mark.parametrize("info_paths", [("/model_info", "/get_model_info"), ("/get_model_info",)])
def test_sglang_admin_calls_and_overload(template, info_paths):
  policy = ScriptedBackend(template, [FINAL_TURN])

  async def run(url):
    backend = create_backend("sglang", url=url, model="qwen3")
    try:
      assert await backend.health()
      assert await backend.update_weights_from_disk("/some/dir", 3) == 3  # sent as "3", read back from the info
      assert await backend.update_weights_from_disk("/some/dir", 4, abort=True) == 4
      return await backend.generate(PromptIds([1, 2, 3]), SamplingParams(max_new_tokens=4))
    finally:
      await backend.close()

  seen, updates = [], []
  with EngineServer(sglang_routes(policy, seen, fail_status=503, info_paths=info_paths, updates=updates)) as engine:
    with pytest.raises(BackendError) as e:
      asyncio.run(run(engine.url))
  assert e.value.overloaded and "/generate" in str(e.value)
  # No flush of its own: SGLang's update flushes the cache. The model info from /model_info, or from
  # /get_model_info where a server before SGLang 0.5.23 has no /model_info (asked once: remembered).
  info = info_paths[0]
  assert seen[:4] == ["/health", "/update_weights_from_disk", info, "/update_weights_from_disk"] and seen[4] == info
  assert updates == [{"model_path": "/some/dir", "weight_version": "3", "abort_all_requests": False, "flush_cache": True},
                     {"model_path": "/some/dir", "weight_version": "4", "abort_all_requests": True, "flush_cache": True}]

  async def unreachable():
    backend = create_backend("sglang", url="http://127.0.0.1:9", model="qwen3")
    try:
      assert not await backend.health()
      await backend.generate(PromptIds([1]), SamplingParams(max_new_tokens=1))
    finally:
      await backend.close()

  with pytest.raises(BackendError) as e:
    asyncio.run(unreachable())
  assert e.value.status == 503


def test_registry_finds_a_registered_backend_by_name():
  @register_backend("test-echo")
  class Echo(Backend):
    def __init__(self, url=None, model=None):
      self.model = model

    async def generate(self, prompt, params):
      return Generation(tuple(prompt.ids[-1:]), (-0.5,), "length", 3)

  assert "test-echo" in backend_names() and "embedded" in backend_names()
  backend = create_backend("test-echo", url=None, model="m")
  assert isinstance(backend, Echo) and backend.model == "m"
  with pytest.raises(ValueError, match="unknown backend"):
    create_backend("nope")
  with pytest.raises(ValueError, match="output_logprobs"):
    Generation((1, 2), (-1.0,), "stop")


def _req(system, last_user, tools=True):
  return ChatRequest(model="m", messages=[Message("system", system), Message("user", last_user)],
                     tools=[ToolSpec("Bash")] if tools else [], max_tokens=None, stream=True)


def test_claude_code_profile_roles():
  p = profile_for("claude_code")
  main_sys = "You are Claude Code, Anthropic's official CLI for Claude."
  assert p.role(_req(main_sys, "fix the bug")) == "main"
  assert p.role(_req(main_sys, "Your task is to create a detailed summary of the conversation so "
                     "far")) == "compaction"
  assert p.role(_req("You are an agent for Claude Code, Anthropic's official CLI", "search")) == \
      "subagent"
  assert p.role(_req("Generate a concise title", "hello", tools=False)) == "auxiliary"
  assert profile_for("some-new-harness").role(_req("x", "y", tools=False)) == "main"
  assert set(PROFILES) == {"claude_code", "openclaw", "codex", "mini"}
  with pytest.raises(ValueError, match="role"):
    RoleRule("boss", "system", "x")


def test_codex_profile_reads_roles_from_its_turn_metadata():
  p = profile_for("codex")
  req = lambda **meta: dataclasses.replace(_req("You are a coding agent", "fix it"), metadata=meta)
  assert p.role(req(request_kind="turn", thread_source="user")) == "main"
  assert p.role(req(request_kind="turn", thread_source="subagent", parent_thread_id="t")) == "subagent"
  assert p.role(req(request_kind="compaction", thread_source="subagent")) == "compaction"
  assert p.role(req(request_kind="memory")) == "auxiliary"
  assert p.role(req()) == "main"  # No metadata: the prompt decides.
  compact = _req("x", "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary")
  assert p.role(compact) == "compaction"
  # A rule on a metadata value that is not a string matches its JSON.
  rule = RoleRule("auxiliary", "meta:compaction", '"phase": "mid_turn"')
  assert HarnessProfile("h", (rule,)).role(req(compaction={"phase": "mid_turn"})) == "auxiliary"
  for place in ("meta:", "metadata", "user"):
    with pytest.raises(ValueError, match="place"):
      RoleRule("main", place, "x")


def test_an_engine_with_a_shorter_context_sets_the_limit(make_shim, template, tmp_path):
  # The shim allows 32K, vLLM was started with less: rollouts are told the engine's window (which the
  # harness adapters pass on, so harnesses compact in time), generations are capped to fit it, and a
  # prompt past it gets the API's "prompt is too long", not a 500 on every call; nothing of it reaches
  # the engine or the log.
  import openai
  policy, seen = ScriptedBackend(template, [FINAL_TURN]), []
  short = template.render([Message("user", "hi")])
  limit = len(short) + 40
  with EngineServer(vllm_routes(policy, seen, max_model_len=limit)) as engine:
    shim = make_shim(None, backend=create_backend("vllm", url=engine.url, model="qwen3"),
                     max_context=32768)
    r = shim.create_rollout("t", "openclaw")
    assert r["context_window"] == limit
    c = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0)
    assert c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]) \
        .choices[0].message.content == FINAL_TURN.text
    assert seen[-1]["max_tokens"] == 40
    n_logged = len(log_calls(r["log_path"]))
    with pytest.raises(openai.BadRequestError) as e:
      c.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 60}])
    assert e.value.code == "context_length_exceeded" and f"{limit} tokens" in str(e.value)
    assert len(seen) == 1 and len(log_calls(r["log_path"])) == n_logged
