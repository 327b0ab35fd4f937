"""The admin API over HTTP, and the role a harness profile gives a logged call."""
import json
import urllib.request

import anthropic

from tests.serving.helpers import FINAL_TURN, log_calls, post


def get(url):
  try:
    with urllib.request.urlopen(url, timeout=30) as resp:
      return resp.status, json.loads(resp.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


def test_rollout_lifecycle_over_http(make_shim):
  shim = make_shim([FINAL_TURN])
  assert get(shim.url + "/health") == (200, {"status": "ok", "live_rollouts": 0})
  status, text = post(shim.url + "/rollouts", {"task_id": "t9", "harness": "claude-code",
                                               "rollout_id": "my-rollout.1"})
  r = json.loads(text)
  assert status == 200 and r["rollout_id"] == "my-rollout.1"
  assert r["base_url"] == shim.url + "/r/my-rollout.1"
  assert r["openai_base_url"] == r["base_url"] + "/v1"
  assert r["context_window"] == 65536  # --max-context (the scripted policy has no limit of its own)
  c = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  c.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
  c.messages.create(model="m", max_tokens=10, system="You are Claude Code.", messages=[
      {"role": "user", "content": "Your task is to create a detailed summary of the conversation "
                                  "so far."}], tools=[{"name": "Bash", "input_schema": {}}])
  status, summary = get(shim.url + "/rollouts/my-rollout.1")
  assert status == 200 and not summary["finished"]
  assert [(x["call_index"], x["role"]) for x in summary["calls"]] == [(0, "main"), (1, "compaction")]
  assert [c.role for c in log_calls(r["log_path"])] == ["main", "compaction"]
  status, text = post(shim.url + "/rollouts/my-rollout.1/finish", {})
  assert status == 200 and json.loads(text)["finished"]
  assert get(shim.url + "/rollouts/my-rollout.1")[1]["finished"]
  assert get(shim.url + "/rollouts/nope")[0] == 404
  assert post(shim.url + "/rollouts/nope/finish", {})[0] == 404
  # Duplicate id, bad types, bad JSON: 400, and no rollout is created.
  for body, raw in [({"task_id": "t", "harness": "h", "rollout_id": "my-rollout.1"}, None),
                    ({"task_id": 3, "harness": "h"}, None), ({"task_id": "t"}, None),
                    ({"task_id": "t", "harness": "h", "rollout_id": "../etc"}, None),
                    (None, b"{")]:
    status, text = post(shim.url + "/rollouts", body, raw=raw)
    assert status == 400 and json.loads(text)["error"]
  assert get(shim.url + "/health")[1]["live_rollouts"] == 0
