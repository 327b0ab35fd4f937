"""Bad input, auth, context limits and backend failures: the right API error, and the right log."""
import json

import anthropic
import openai
import pytest

from clawjax.serving.backends.scripted import ScriptedBackend

from tests.serving.helpers import (FINAL_TURN, GOOD, GOOD_OAI, WRITE_TURN, assert_linear_zero_drift,
                                   echo_tool_call_round, log_calls, log_size, post)



def _with(body, **changes):
  return {**body, **changes}


BAD_ANTHROPIC = [
    ("malformed json", None, b'{"model": "m", "messages": [', "valid JSON"),
    ("body not an object", [1, 2], None, "body"),
    ("NaN constant", None, b'{"model": "m", "max_tokens": 5, "temperature": NaN, "messages": []}',
     "NaN"),
    ("missing messages", {"model": "m", "max_tokens": 5}, None, "messages"),
    ("missing max_tokens", {"model": "m", "messages": GOOD["messages"]}, None, "max_tokens"),
    ("messages wrong type", _with(GOOD, messages="hi"), None, "messages"),
    ("bad role", _with(GOOD, messages=[{"role": "robot", "content": "x"}]), None, "messages.0.role"),
    ("content wrong type", _with(GOOD, messages=[{"role": "user", "content": 3}]), None,
     "messages.0.content"),
    ("block without type", _with(GOOD, messages=[{"role": "user", "content": [{"text": "x"}]}]),
     None, "messages.0.content.0.type"),
    ("tool_result without id", _with(GOOD, messages=[{"role": "user", "content": [
        {"type": "tool_result", "content": "x"}]}]), None, "tool_use_id"),
    ("max_tokens string", _with(GOOD, max_tokens="5"), None, "max_tokens"),
    ("max_tokens zero", _with(GOOD, max_tokens=0), None, "max_tokens"),
    ("stream not bool", _with(GOOD, stream="yes"), None, "stream"),
    ("tools not list", _with(GOOD, tools={}), None, "tools"),
    ("prefill", _with(GOOD, messages=[{"role": "user", "content": "x"},
                                      {"role": "assistant", "content": "y"}]), None, "messages.1"),
]


@pytest.mark.parametrize("name,body,raw,field", BAD_ANTHROPIC, ids=[b[0] for b in BAD_ANTHROPIC])
def test_bad_anthropic_input_is_400_and_writes_nothing(make_shim, tmp_path, name, body, raw, field):
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  url = rollout["base_url"] + "/v1/messages"
  status, text = post(url, body, rollout["api_key"], raw=raw)
  assert status == 400, text
  err = json.loads(text)
  assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
  assert field in err["error"]["message"]
  assert log_size(tmp_path / "logs") == 0
  status, _ = post(url, GOOD, rollout["api_key"])  # Still serving.
  assert status == 200


BAD_OPENAI = [
    ("malformed json", None, b"{nope", "valid JSON"),
    ("missing messages", {"model": "m"}, None, "messages"),
    ("tool without id", _with(GOOD_OAI, messages=[{"role": "tool", "content": "x"}]), None,
     "messages.0.tool_call_id"),
    ("arguments not string", _with(GOOD_OAI, messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "a", "type": "function",
                                              "function": {"name": "f", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "r"}]), None,
     "messages.1.tool_calls.0.function.arguments"),
    ("n > 1", _with(GOOD_OAI, n=2), None, "n"),
    ("temperature string", _with(GOOD_OAI, temperature="hot"), None, "temperature"),
]


@pytest.mark.parametrize("name,body,raw,field", BAD_OPENAI, ids=[b[0] for b in BAD_OPENAI])
def test_bad_openai_input_is_400_and_writes_nothing(make_shim, tmp_path, name, body, raw, field):
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "openclaw")
  url = rollout["openai_base_url"] + "/chat/completions"
  status, text = post(url, body, rollout["api_key"], raw=raw)
  assert status == 400, text
  err = json.loads(text)["error"]
  assert err["type"] == "invalid_request_error" and field in err["message"]
  assert log_size(tmp_path / "logs") == 0
  assert post(url, GOOD_OAI, rollout["api_key"])[0] == 200


def test_lone_surrogate_escape_is_served_as_replacement_character(make_shim, template):
  # A JavaScript harness that cut a tool output inside an emoji sends a lone "\ud83d" escape; the
  # tokenizer needs UTF-8, so it becomes U+FFFD instead of a 500.
  shim = make_shim([FINAL_TURN])
  rollout = shim.create_rollout("t", "claude_code")
  raw = b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "cut \\ud83d here"}]}'
  status, text = post(rollout["base_url"] + "/v1/messages", None, rollout["api_key"], raw=raw)
  assert status == 200, text
  [call] = log_calls(rollout["log_path"])
  assert template.tokenizer.decode(call.input_ids).count("cut \ufffd here") == 1


def test_oversized_body_is_413(make_shim, tmp_path):
  shim = make_shim([FINAL_TURN], max_body_bytes=20_000)
  rollout = shim.create_rollout("t", "claude_code")
  url = rollout["base_url"] + "/v1/messages"
  big = _with(GOOD, messages=[{"role": "user", "content": "x" * 30_000}])
  status, text = post(url, big, rollout["api_key"])
  assert status == 413 and json.loads(text)["error"]["type"] == "request_too_large"
  assert log_size(tmp_path / "logs") == 0
  assert post(url, GOOD, rollout["api_key"])[0] == 200


def test_keys_and_prefixes_never_cross(make_shim, tmp_path):
  shim = make_shim([FINAL_TURN])
  a = shim.create_rollout("ta", "claude_code")
  b = shim.create_rollout("tb", "claude_code")
  for url, key in [(a["base_url"], b["api_key"]), (b["base_url"], a["api_key"]),
                   (a["base_url"], "sk-wrong"), (a["base_url"], None),
                   (a["base_url"].rsplit("/", 1)[0] + "/r-unknown", a["api_key"])]:
    status, text = post(url + "/v1/messages", GOOD, key)
    assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error"
  assert log_size(tmp_path / "logs") == 0
  # The key alone (no prefix) routes to its own rollout.
  root = a["base_url"].rsplit("/r/", 1)[0]
  assert post(root + "/v1/messages", GOOD, b["api_key"])[0] == 200
  assert log_calls(a["log_path"]) == [] and len(log_calls(b["log_path"])) == 1
  with pytest.raises(openai.AuthenticationError):
    openai.OpenAI(base_url=a["openai_base_url"], api_key=b["api_key"], max_retries=0
                  ).chat.completions.create(**GOOD_OAI)


def test_finished_rollout_gets_401_and_summary(make_shim):
  shim = make_shim([FINAL_TURN])
  r = shim.create_rollout("t", "claude_code")
  c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  c.messages.create(**GOOD)
  summary = shim.finish_rollout(r["rollout_id"])
  assert summary["finished"] and [x["status"] for x in summary["calls"]] == ["ok"]
  with pytest.raises(anthropic.AuthenticationError):
    c.messages.create(**GOOD)
  assert len(log_calls(r["log_path"])) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_too_long_shapes(make_shim, tmp_path, stream):
  shim = make_shim([FINAL_TURN], max_context=64)
  r = shim.create_rollout("t", "claude_code")
  long_msgs = [{"role": "user", "content": "word " * 200}]
  c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  with pytest.raises(anthropic.BadRequestError) as e:
    c.messages.create(model="m", max_tokens=10, messages=long_msgs, stream=stream)
  assert e.value.body["error"]["type"] == "invalid_request_error"
  assert "prompt is too long" in e.value.body["error"]["message"]
  o = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0)
  with pytest.raises(openai.BadRequestError) as e:
    o.chat.completions.create(model="m", messages=long_msgs, stream=stream)
  assert e.value.code == "context_length_exceeded"
  assert log_size(tmp_path / "logs") == 0


@pytest.mark.parametrize("status,anthropic_error,openai_error", [
    (500, anthropic.InternalServerError, openai.InternalServerError),
    (529, anthropic.OverloadedError, openai.InternalServerError)])
def test_backend_failure_is_api_error_and_error_record(make_shim, template, status,
                                                      anthropic_error, openai_error):
  backend = ScriptedBackend(template, [FINAL_TURN], failures={0: status, 2: status})
  shim = make_shim(None, backend=backend)
  r = shim.create_rollout("t", "claude_code")
  c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  with pytest.raises(anthropic_error) as e:
    c.messages.create(**GOOD)
  assert e.value.status_code == status
  # The harness's own retry succeeds and continues the same path.
  assert c.messages.create(**GOOD).content[0].text == FINAL_TURN.text
  o = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0)
  with pytest.raises(openai_error) as e:
    o.chat.completions.create(**GOOD_OAI)
  assert e.value.status_code == (503 if status == 529 else 500)
  calls = log_calls(r["log_path"])
  assert [c.status for c in calls] == ["error", "ok", "error"]
  assert calls[0].output_ids == () and "injected" in calls[0].extra["error"]
  assert calls[0].input_ids == calls[1].input_ids


def test_sdk_retry_after_500_leaves_one_path(make_shim, template):
  """Claude Code retries a 500 with the identical body: the error is a dropped leaf, no drift."""
  backend = ScriptedBackend(template, [WRITE_TURN, FINAL_TURN], failures={1: 500})
  shim = make_shim(None, backend=backend)
  r = shim.create_rollout("t", "claude_code")
  c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=2)
  assert echo_tool_call_round(c, max_tokens=100).content[0].text
  calls = assert_linear_zero_drift(r["log_path"], 2)
  assert [c.status for c in calls] == ["ok", "error", "ok"]


def test_failure_after_stream_started_is_sse_error(make_shim, template):
  backend = ScriptedBackend(template, [FINAL_TURN], failures={0: 529}, latency_s=0.3)
  shim = make_shim(None, backend=backend, keepalive_s=0.05)
  r = shim.create_rollout("t", "claude_code")
  status, text = post(r["base_url"] + "/v1/messages", _with(GOOD, stream=True), r["api_key"])
  assert status == 200  # Headers went out with the first keep-alive.
  events = [l[7:] for l in text.splitlines() if l.startswith("event: ")]
  assert events[0] == "message_start" and "ping" in events and events[-1] == "error"
  data = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: ")]
  assert data[-1]["error"]["type"] == "overloaded_error"
  assert [c.status for c in log_calls(r["log_path"])] == ["error"]


def test_memoised_history_is_still_validated(make_shim, tmp_path):
  """A message that changed since the previous call is converted (and validated) again."""
  shim = make_shim([FINAL_TURN])
  r = shim.create_rollout("t", "claude_code")
  url = r["base_url"] + "/v1/messages"
  two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
         {"role": "user", "content": "c"}]
  assert post(url, _with(GOOD, messages=two), r["api_key"])[0] == 200
  bad = [{"role": "user", "content": [{"type": "text", "text": 5}]}] + two[1:]
  status, text = post(url, _with(GOOD, messages=bad), r["api_key"])
  assert status == 400 and "messages.0.content.0.text" in text
  assert len(log_calls(r["log_path"])) == 1
