"""`python -m clawjax.serving` as a real process: flags, one call, clean shutdown on SIGTERM."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import openai
import pytest

from clawjax.serving.__main__ import parse_args

from tests.ports import free_port
from tests.serving.helpers import log_calls, post

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_flags_map_to_config():
  args = parse_args(["--backend", "scripted", "--model", "qwen3", "--log-dir", "d",
                     "--max-new-tokens", "77", "--max-context", "999", "--temperature", "0.6",
                     "--backend-arg", "script=s.json", "--backend-arg", "failures=1:500",
                     "--backend-arg", "max_slots=8", "--backend-arg", "latency_s=0.5"])
  assert (args.max_new_tokens, args.max_context, args.temperature) == (77, 999, 0.6)
  assert dict(args.backend_arg) == {"script": "s.json", "failures": "1:500", "max_slots": 8,
                                    "latency_s": 0.5}
  limits = parse_args(["--backend", "scripted", "--model", "qwen3", "--log-dir", "d", "--read-timeout-s", "7",
                       "--max-connections-per-client", "9", "--max-json-depth", "11", "--min-free-log-bytes",
                       "1000", "--no-fsync-call-log", "--admin-token-file", "t"])
  assert (limits.read_timeout_s, limits.max_connections_per_client, limits.max_json_depth,
          limits.min_free_log_bytes, limits.fsync_call_log, limits.admin_token_file) == (7, 9, 11, 1000, False, "t")
  defaults = parse_args(["--backend", "scripted", "--model", "qwen3", "--log-dir", "d"])
  assert defaults.fsync_call_log and defaults.admin_token_file is None and defaults.workers == 1
  workers = parse_args(["--backend", "sglang", "--model", "qwen3", "--log-dir", "d", "--workers", "4",
                        "--worker-start-timeout-s", "90"])
  assert (workers.workers, workers.worker_start_timeout_s) == (4, 90)


@pytest.mark.parametrize("event_loop,token_from_env", [("uvloop", False), ("asyncio", True)])
def test_cli_serves_a_scripted_call_and_stops_cleanly(tmp_path, event_loop, token_from_env):
  """The admin token comes from $CLAWJAX_ADMIN_TOKEN, or is generated into LOG_DIR/admin_token (0600)."""
  script = tmp_path / "turns.json"
  script.write_text(json.dumps([{"text": "hello from the script"}]))
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  env = {k: v for k, v in os.environ.items() if k != "CLAWJAX_ADMIN_TOKEN"}
  env.update(PYTHONPATH=ROOT, **({"CLAWJAX_ADMIN_TOKEN": "the-trainers-token"} if token_from_env else {}))
  proc = subprocess.Popen(
      [sys.executable, "-m", "clawjax.serving", "--backend", "scripted", "--model", "qwen3",
       "--backend-arg", f"script={script}", "--port", str(port), "--log-dir", str(tmp_path / "logs"),
       "--max-new-tokens", "64", "--event-loop", event_loop], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 60
    while True:
      try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
          assert json.loads(resp.read())["status"] == "ok"
          break
      except OSError:
        assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
        time.sleep(0.2)
    token_file = tmp_path / "logs" / "admin_token"
    if token_from_env:
      token = "the-trainers-token"
      assert not token_file.exists()
    else:
      token = token_file.read_text().strip()
      assert len(token) >= 43 and token_file.stat().st_mode & 0o777 == 0o600
    assert post(url + "/rollouts", {"task_id": "t", "harness": "openclaw"})[0] == 401
    status, text = post(url + "/rollouts", {"task_id": "t", "harness": "openclaw"}, token=token)
    r = json.loads(text)
    c = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0)
    reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello from the script"
  finally:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
  (call,) = log_calls(r["log_path"])
  assert call.extra["max_new_tokens"] == 64 and call.harness == "openclaw"
