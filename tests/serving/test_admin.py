"""The control routes over HTTP: the admin token guards them, ids are strict; the role a harness
profile gives a logged call."""
import json
import os

import anthropic
import pytest

from tests.serving.helpers import FINAL_TURN, GOOD, get, log_calls, log_size, post


def test_rollout_lifecycle_over_http(make_shim):
  shim = make_shim([FINAL_TURN])
  token = shim.admin_token
  assert get(shim.url + "/health") == (200, {"status": "ok", "live_rollouts": 0})
  status, text = post(shim.url + "/rollouts", {"task_id": "t9", "harness": "claude_code",
                                               "rollout_id": "my-rollout.1"}, token=token)
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
  status, summary = get(shim.url + "/rollouts/my-rollout.1", token)
  assert status == 200 and not summary["finished"] and summary["failed"] is None
  assert [(x["call_index"], x["role"]) for x in summary["calls"]] == [(0, "main"), (1, "compaction")]
  assert [c.role for c in log_calls(r["log_path"])] == ["main", "compaction"]
  status, text = post(shim.url + "/rollouts/my-rollout.1/finish", {}, token=token)
  assert status == 200 and json.loads(text)["finished"]
  assert get(shim.url + "/rollouts/my-rollout.1", token)[1]["finished"]
  assert get(shim.url + "/rollouts/nope", token)[0] == 404
  assert post(shim.url + "/rollouts/nope/finish", {}, token=token)[0] == 404
  # Duplicate id, bad types, bad JSON: 400, and no rollout is created.
  for body, raw in [({"task_id": "t", "harness": "h", "rollout_id": "my-rollout.1"}, None),
                    ({"task_id": 3, "harness": "h"}, None), ({"task_id": "t"}, None),
                    ({"task_id": "t", "harness": "h", "rollout_id": "../etc"}, None),
                    (None, b"{")]:
    status, text = post(shim.url + "/rollouts", body, raw=raw, token=token)
    assert status == 400 and json.loads(text)["error"]["message"]
  assert get(shim.url + "/health")[1]["live_rollouts"] == 0


def test_control_routes_need_the_admin_token(make_shim, tmp_path):
  """Without the token 401, with any other (a rollout's own key, a guess) 403; nothing changes."""
  shim = make_shim([FINAL_TURN])
  r = shim.create_rollout("t", "claude_code")
  rid, key = r["rollout_id"], r["api_key"]
  for token, status in [(None, 401), (key, 403), ("sk-clawjax-guess", 403), (shim.admin_token + "x", 403)]:
    assert post(shim.url + "/rollouts", {"task_id": "t", "harness": "h"}, token=token)[0] == status
    assert post(shim.url + f"/rollouts/{rid}/finish", {}, token=token)[0] == status
    got, body = get(shim.url + f"/rollouts/{rid}", token)
    assert got == status and body["error"]["type"] == "invalid_request_error", body
    assert rid not in json.dumps(body) and "log" not in json.dumps(body)
  # The rollout's key as x-api-key opens its model routes, never the control routes.
  assert post(shim.url + f"/rollouts/{rid}/finish", {}, key=key)[0] == 401
  assert get(shim.url + "/health")[1]["live_rollouts"] == 1
  assert post(r["base_url"] + "/v1/messages", GOOD, key)[0] == 200
  assert os.listdir(tmp_path / "logs") == [f"{rid}.jsonl"]


@pytest.mark.parametrize("rollout_id", ["abc\n", "abc\ndef", "\nabc", "a/b", ".hidden", "a" * 129, ""])
def test_rollout_ids_are_validated_whole(make_shim, tmp_path, rollout_id):
  shim = make_shim([FINAL_TURN])
  status, text = post(shim.url + "/rollouts", {"task_id": "t", "harness": "h", "rollout_id": rollout_id},
                      token=shim.admin_token)
  if rollout_id == "":  # (An empty id asks for a generated one.)
    assert status == 200
    return
  assert status == 400 and "rollout_id" in json.loads(text)["error"]["message"], text
  assert log_size(tmp_path / "logs") == 0


def test_generated_ids_and_keys_carry_128_random_bits(make_shim):
  shim = make_shim([FINAL_TURN])
  r = shim.create_rollout("t", "h")
  assert r["rollout_id"].startswith("r-") and len(r["rollout_id"]) == 2 + 32
  assert r["api_key"].startswith("sk-clawjax-") and len(r["api_key"]) == 11 + 32
  assert len(shim.admin_token) >= 43  # 256 bits, URL-safe base64
