"""Fuzzing the three dialects' model routes: random JSON, mutated valid bodies, byte-level damage (invalid
UTF-8, cut or spliced JSON), huge and deeply nested bodies, special-token text. Every answer is a
well-formed 4xx in the dialect's shape or a correct 200; never a 500; a 4xx writes nothing and a 200
writes exactly its record; the process's memory stays bounded."""
import json
import resource

from hypothesis import HealthCheck, given, settings, strategies as st

from clawjax import calllog

from tests.serving.helpers import FINAL_TURN, WRITE_TURN, post

MAX_BODY = 256 * 1024
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
           "</tool_call>", "<tool_response>", "\ud83d\ude00", "\x00", "\\u0000"]

ANTHROPIC_BODIES = [
    {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "max_tokens": 50, "stream": True, "system": [{"type": "text", "text": "sys"}],
     "tools": [{"name": "write_file", "description": "d", "input_schema": {"type": "object", "properties": {
         "path": {"type": "string"}}}}],
     "messages": [{"role": "user", "content": [{"type": "text", "text": "go"}]},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                                    {"type": "tool_use", "id": "toolu_1", "name": "write_file",
                                                     "input": {"path": "a"}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                "content": [{"type": "text", "text": "ok"}], "is_error": False}]}]},
]
OPENAI_BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 40,
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
     "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": [{"type": "text", "text": "go"}]},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "done"}]},
]
RESPONSES_BODIES = [
    {"model": "m", "input": [{"role": "user", "content": "hi"}]},
    {"model": "m", "stream": True, "max_output_tokens": 40, "include": ["reasoning.encrypted_content"],
     "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
               {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]},
               {"type": "web_search"}],
     "client_metadata": {"x-codex-turn-metadata": "{\"request_kind\": \"turn\", \"thread_id\": \"t\"}"},
     "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
               {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
               {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
               {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "g", "namespace": "ns",
                "arguments": "{\"a\": 1}"},
               {"type": "function_call_output", "call_id": "call_1", "output": "done"}]},
]
BODIES = {"anthropic": ANTHROPIC_BODIES, "openai": OPENAI_BODIES, "responses": RESPONSES_BODIES}
ROUTES = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions", "responses": "/v1/responses"}

texts = st.one_of(st.text(max_size=40), st.sampled_from(SPECIAL),
                  st.lists(st.sampled_from(SPECIAL), max_size=4).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), texts)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(texts, kids, max_size=4)),
                           max_leaves=20)


@st.composite
def mutated(draw, bodies):
  """A valid body with a few values replaced, keys dropped or added, anywhere in it."""
  body = json.loads(json.dumps(draw(st.sampled_from(bodies))))
  for _ in range(draw(st.integers(1, 4))):
    node = body
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
      key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
      if not isinstance(node[key], (dict, list)):
        break
      node = node[key]
    if isinstance(node, dict) and node:
      key = draw(st.sampled_from(sorted(node)))
      action = draw(st.sampled_from(["replace", "drop", "add"]))
      if action == "replace":
        node[key] = draw(json_values)
      elif action == "drop":
        del node[key]
      else:
        node[draw(texts)] = draw(json_values)
    elif isinstance(node, list) and node:
      node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
  return json.dumps(body).encode()


@st.composite
def damaged(draw, bodies):
  """A valid body's bytes cut, spliced with invalid UTF-8 or overwritten."""
  raw = bytearray(json.dumps(draw(st.sampled_from(bodies))).encode())
  for _ in range(draw(st.integers(1, 3))):
    at = draw(st.integers(0, len(raw)))
    action = draw(st.sampled_from(["cut", "insert", "flip"]))
    if action == "cut":
      del raw[at:at + draw(st.integers(1, 20))]
    elif action == "insert":
      raw[at:at] = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\"", b"{", b"]",
                                         b"\\ud800", b"NaN", b"\x00"]))
    elif raw:
      raw[min(at, len(raw) - 1)] = draw(st.integers(0, 255))
  return bytes(raw)


@st.composite
def extreme(draw, bodies):
  """Huge (past the body limit, or a huge prompt under it) or deeply nested bodies."""
  body = json.loads(json.dumps(draw(st.sampled_from(bodies))))
  kind = draw(st.sampled_from(["over_limit", "long_text", "deep"]))
  if kind == "deep":
    depth = draw(st.sampled_from([129, 1000, 1025, 50_000]))
    return json.dumps(body).encode()[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
  body["messages" if "messages" in body else "input"][-1]["content"] = draw(st.sampled_from(SPECIAL)) * (
      (MAX_BODY * 2 if kind == "over_limit" else MAX_BODY // 2) // 12)
  return json.dumps(body).encode()


def bodies_for(bodies):
  return st.one_of(json_values.map(lambda v: json.dumps(v).encode()), mutated(bodies), damaged(bodies),
                   extreme(bodies))


def _check_200(api, body, text):
  """The answer is the dialect's success shape, whole (a stream ends with its last event)."""
  if json.loads(body).get("stream") is not True:  # (Only a JSON object can have been answered 200.)
    out = json.loads(text)
    assert out["id"].startswith({"anthropic": "msg_", "openai": "chatcmpl-", "responses": "resp_"}[api]), out
    return
  if api == "anthropic":
    assert text.rstrip().endswith('data: {"type":"message_stop"}'), text[-300:]
  elif api == "responses":
    assert json.loads(text.rstrip().rsplit("data: ", 1)[1])["type"] == "response.completed", text[-300:]
  else:
    assert text.rstrip().endswith("data: [DONE]"), text[-300:]


def _check_error(api, status, text):
  assert 400 <= status < 500, (status, text)
  err = json.loads(text)
  if api == "anthropic":
    assert err["type"] == "error" and isinstance(err["error"]["message"], str) and err["error"]["type"]
  else:
    assert isinstance(err["error"]["message"], str) and err["error"]["type"]


def test_fuzzed_bodies_get_a_4xx_or_a_correct_200(make_shim, template):
  script = [WRITE_TURN, FINAL_TURN]
  shim = make_shim(script, max_body_bytes=MAX_BODY, max_context=40_000)
  rollouts = {api: shim.create_rollout("t", "claude_code") for api in BODIES}
  seen = {"ok": 0, "4xx": 0}
  rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

  @settings(max_examples=300, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(st.sampled_from(sorted(BODIES)).flatmap(lambda api: st.tuples(st.just(api), bodies_for(BODIES[api]))))
  def fuzz(case):
    api, body = case
    r = rollouts[api]
    url = r["base_url"] + ROUTES[api]
    before = calllog.load(r["log_path"]).calls.get(r["rollout_id"], [])
    status, text = post(url, None, r["api_key"], raw=body)
    after = calllog.load(r["log_path"]).calls.get(r["rollout_id"], [])
    if status == 200:
      _check_200(api, body, text)
      assert len(after) == len(before) + 1 and after[-1].status == "ok"
      seen["ok"] += 1
    else:
      _check_error(api, status, text)
      assert len(after) == len(before), f"a {status} wrote a record"
      seen["4xx"] += 1

  fuzz()  # pylint: disable=no-value-for-parameter
  assert seen["ok"] >= 5 and seen["4xx"] >= 50, seen  # Both outcomes were exercised.
  grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
  assert grown_mb < 300, f"peak RSS grew {grown_mb:.0f} MB"
