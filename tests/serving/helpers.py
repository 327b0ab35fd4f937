"""Checks shared by the serving tests: what a rollout's log must look like."""
import json
import os
import urllib.error
import urllib.request

from clawjax.calllog import load
from clawjax.serving.backends.scripted import ScriptTurn
from clawjax.tree.filters import filter_rollout


WRITE_TURN = ScriptTurn(text="I will write the file.", thinking="The user wants a file.",
                        tool_calls=(("write_file", {"path": "a.txt", "content": "hello"}),))
READ_TURN = ScriptTurn(text="", tool_calls=(("read_file", {"path": "a.txt"}),))
FINAL_TURN = ScriptTurn(text="Done: a.txt says hello.")
GOOD = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
GOOD_OAI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def log_calls(path):
  loaded = load(path)
  assert not loaded.problems
  return [c for calls in loaded.calls.values() for c in calls]


def assert_linear_zero_drift(path, n_ok):
  """The log rebuilds into one main path: every ok call extends the previous call's input + output."""
  calls = log_calls(path)
  ok = [c for c in calls if c.status == "ok"]
  assert len(ok) == n_ok
  for prev, cur in zip(ok, ok[1:]):
    history = prev.input_ids + prev.output_ids
    assert cur.input_ids[:len(history)] == history, f"call {cur.call_index} does not extend its parent"
    assert cur.extra["drifted_turns"] == 0
  filtered = filter_rollout(calls[0].rollout_id, calls)
  assert filtered.drift_calls == 0
  assert filtered.leaves == 1
  return calls


def log_size(log_dir):
  """Total bytes in every log under log_dir (a rejected request must not change it)."""
  if not os.path.isdir(log_dir):
    return 0
  return sum(os.path.getsize(os.path.join(log_dir, n)) for n in os.listdir(log_dir))


def post(url, body, key=None, raw=None, token=None):
  """(status, text) of a POST with a JSON body (or `raw` bytes), errors included; `key` is a rollout's
  x-api-key, `token` the admin token (a bearer token)."""
  data = raw if raw is not None else json.dumps(body).encode()
  return request("POST", url, data, key, token)


def get(url, token=None):
  """(status, decoded JSON) of a GET, errors included."""
  status, text = request("GET", url, None, None, token)
  return status, json.loads(text)


def request(method, url, data, key=None, token=None):
  headers = {"content-type": "application/json"}
  if key:
    headers["x-api-key"] = key
  if token:
    headers["Authorization"] = f"Bearer {token}"
  req = urllib.request.Request(url, data=data, headers=headers, method=method)
  try:
    with urllib.request.urlopen(req, timeout=60) as resp:
      return resp.status, resp.read().decode()
  except urllib.error.HTTPError as e:
    return e.code, e.read().decode()


def echo_tool_call_round(client, max_tokens: int):
  """Two Anthropic calls as Claude Code makes them: a tool call, echoed back unchanged with its
  tool_result, then the answer. Returns the second reply."""
  tools = [{"name": "write_file", "input_schema": {"type": "object"}}]
  msgs = [{"role": "user", "content": "go"}]
  first = client.messages.create(model="m", max_tokens=max_tokens, messages=msgs, tools=tools)
  msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[-1].id,
                                         "content": "ok"}]}]
  return client.messages.create(model="m", max_tokens=max_tokens, messages=msgs, tools=tools)


def anthropic_text(client, messages, stream, max_tokens=50):
  """The text of a Messages call's reply through the SDK, streamed (read to its last event) or not."""
  if stream:
    with client.messages.stream(model="m", max_tokens=max_tokens, messages=messages) as s:
      return s.get_final_message().content[0].text
  return client.messages.create(model="m", max_tokens=max_tokens, messages=messages).content[0].text


def openai_text(client, messages, stream):
  """The text of a Chat Completions reply through the SDK; a stream must end with its finish reason."""
  if stream:
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    return "".join(c.choices[0].delta.content or "" for c in chunks)
  return client.chat.completions.create(model="m", messages=messages).choices[0].message.content


def responses_text(client, text, stream):
  """The text of a Responses call's reply through the SDK. A stream must end with response.completed;
  one that ends with response.failed raises ValueError with its error message."""
  if not stream:
    return client.responses.create(model="m", input=text).output_text
  events = list(client.responses.create(model="m", input=text, stream=True))
  if events[-1].type == "response.failed":
    raise ValueError(events[-1].response.error.message)
  assert events[-1].type == "response.completed", events[-1].type
  return events[-1].response.output_text
