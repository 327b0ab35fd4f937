"""kill -9 of the shim process under 64 concurrent rollouts (both SDKs, streamed and not): every call a
client saw acknowledged is on disk, and every line on disk is whole except, at most, the last line of a
file: the record being written at the kill, which no client was answered for."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import anthropic
import openai
import pytest

from clawjax import calllog

from tests.ports import free_port
from tests.serving.helpers import anthropic_text, openai_text, post

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLLOUTS = 64
TOKEN = "kill-test-admin-token"


def _wait_up(url, proc):
  deadline = time.time() + 60
  while True:
    try:
      with urllib.request.urlopen(url + "/health", timeout=2):
        return
    except OSError:
      assert proc.poll() is None and time.time() < deadline, "shim did not come up"
      time.sleep(0.2)


def _play(r, k, acked, killed, errors):
  """One rollout's harness: calls until the shim dies, the history growing as a harness's does."""
  a = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0, timeout=30)
  o = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0, timeout=30)
  msgs = [{"role": "user", "content": f"rollout {k}: go"}]
  n = 0
  while True:
    stream = (n + k) % 2 == 0
    try:
      text = anthropic_text(a, msgs, stream, 64) if (n + k) % 3 else openai_text(o, msgs, stream)
    except Exception as e:  # pylint: disable=broad-except
      if not killed.is_set():
        errors.append(e)
      return  # The shim is gone (an answer cut off mid-stream was not acknowledged).
    acked[r["rollout_id"]] += 1
    n += 1
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {n}"}]


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_call(tmp_path):
  script = tmp_path / "turns.json"
  script.write_text(json.dumps([{"text": "Working on it. " * 20}]))
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  log_dir = tmp_path / "logs"
  proc = subprocess.Popen(
      [sys.executable, "-m", "clawjax.serving", "--backend", "scripted", "--model", "qwen3",
       "--backend-arg", f"script={script}", "--backend-arg", "latency_s=0.02", "--port", str(port),
       "--log-dir", str(log_dir), "--keepalive-s", "0.01"],
      env=dict(os.environ, PYTHONPATH=ROOT, CLAWJAX_ADMIN_TOKEN=TOKEN), stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL)
  try:
    _wait_up(url, proc)
    rollouts = [json.loads(post(url + "/rollouts", {"task_id": "t", "harness": "claude_code"},
                                token=TOKEN)[1]) for _ in range(ROLLOUTS)]
    acked = {r["rollout_id"]: 0 for r in rollouts}
    killed, errors = threading.Event(), []
    players = [threading.Thread(target=_play, args=(r, k, acked, killed, errors), daemon=True)
               for k, r in enumerate(rollouts)]
    for t in players:
      t.start()
    deadline = time.time() + 120
    while sum(acked.values()) < 6 * ROLLOUTS and time.time() < deadline:
      time.sleep(0.05)
    killed.set()
    os.kill(proc.pid, signal.SIGKILL)  # Mid-flight: calls are being generated, written and answered.
    proc.wait(timeout=30)
    for t in players:
      t.join(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert not errors, errors[:3]
  assert sum(acked.values()) >= 6 * ROLLOUTS
  for r in rollouts:
    data = open(r["log_path"], "rb").read()
    lines = data.split(b"\n")
    if lines[-1]:  # A last line without its line end: torn by the kill, never acknowledged.
      lines.pop()
    good = b"".join(line + b"\n" for line in lines if line)
    with open(tmp_path / "whole.jsonl", "wb") as f:
      f.write(good)
    loaded = calllog.load(tmp_path / "whole.jsonl")  # errors="raise": every whole line is a valid record
    ok = [c for c in loaded.calls.get(r["rollout_id"], []) if c.status == "ok"]
    assert len(ok) >= acked[r["rollout_id"]], (r["rollout_id"], len(ok), acked[r["rollout_id"]])
