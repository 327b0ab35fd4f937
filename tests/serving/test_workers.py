"""A shim with several worker processes (ShimConfig.workers, `--workers`): rollouts spread over the
workers, each call logged once by its rollout's worker, the admin token on the front's control routes, a
key that opens its own worker only, finish draining calls in flight on the owning worker, and kill -9
of a worker (no acknowledged call lost; its rollouts then get the API's error, not silence)."""
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

import anthropic
import openai
import pytest

from clawjax import calllog
from clawjax.config import ConfigError
from clawjax.serving.backends.scripted import ScriptedBackend
from clawjax.serving.front import ShimProcessPool
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.serving.workers import WorkerSpec

from tests.ports import free_port
from tests.serving.helpers import GOOD, GOOD_OAI, anthropic_text, get, log_calls, log_size, openai_text, post

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LATENCY_S = 1.0  # Long enough to finish a rollout while its call is in flight.


def _script(directory):
  path = directory / "turns.json"
  path.write_text(json.dumps([{"text": "Working on it."}]))
  return str(path)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
  """Two worker processes behind a front, on the scripted policy (each worker its own backend)."""
  tmp = tmp_path_factory.mktemp("workers")
  spec = WorkerSpec("scripted", "qwen3", backend_options={"script": _script(tmp), "latency_s": LATENCY_S})
  with ShimProcessPool(ShimConfig(log_dir=str(tmp / "logs"), workers=2), spec) as shim:
    yield shim


def _port(rollout):
  return urllib.parse.urlsplit(rollout["base_url"]).port


def _create(shim, n):
  rollouts = []
  for _ in range(n):
    status, text = post(shim.url + "/rollouts", {"task_id": "t", "harness": "claude_code"},
                        token=shim.admin_token)
    assert status == 200, text
    rollouts.append(json.loads(text))
  return rollouts


def test_rollouts_spread_over_the_workers_and_each_call_is_logged_once(pool):
  rollouts = _create(pool, 4)
  health = get(pool.url + "/health")[1]
  ports = sorted(urllib.parse.urlsplit(w["url"]).port for w in health["workers"])
  assert health["status"] == "ok" and health["live_rollouts"] == 4
  assert sorted(map(_port, rollouts)) == sorted(ports * 2)  # Least loaded first: two on each worker.
  assert all(w["live_rollouts"] == 2 for w in health["workers"])

  def play(k, r):
    a = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
    o = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": f"rollout {k}"}]
    for n in range(3):
      stream = (n + k) % 2 == 0
      text = anthropic_text(a, msgs, stream) if k % 2 else openai_text(o, msgs, stream)
      assert text == "Working on it."
      msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {n}"}]
    return 3

  with concurrent.futures.ThreadPoolExecutor(len(rollouts)) as ex:
    acked = list(ex.map(play, range(len(rollouts)), rollouts))
  for r, n in zip(rollouts, acked):
    summary = pool.finish_rollout(r["rollout_id"])
    assert summary["finished"] and summary["failed"] is None
    assert [c["call_index"] for c in summary["calls"]] == list(range(n))
    calls = log_calls(r["log_path"])
    assert [c.call_index for c in calls] == list(range(n)) and {c.status for c in calls} == {"ok"}
    assert {c.rollout_id for c in calls} == {r["rollout_id"]}
  assert get(pool.url + "/health")[1]["live_rollouts"] == 0


def test_the_front_needs_the_admin_token_and_a_key_opens_its_own_worker_only(pool):
  log_dir = pool.server.config.log_dir
  before = log_size(log_dir)
  a, b = _create(pool, 2)
  assert _port(a) != _port(b)
  rid = a["rollout_id"]
  for token, status in [(None, 401), (a["api_key"], 403), (pool.admin_token + "x", 403)]:
    assert post(pool.url + "/rollouts", {"task_id": "t", "harness": "h"}, token=token)[0] == status
    assert post(pool.url + f"/rollouts/{rid}/finish", {}, token=token)[0] == status
    got, body = get(pool.url + f"/rollouts/{rid}", token)
    assert got == status and body["error"]["type"] == "invalid_request_error" and rid not in json.dumps(body)
  worker_root = a["base_url"].rsplit("/r/", 1)[0]  # A worker's own control routes need it too.
  assert post(worker_root + f"/rollouts/{rid}/finish", {}, key=a["api_key"])[0] == 401
  assert get(worker_root + f"/rollouts/{rid}", a["api_key"])[0] == 403
  # A's key on B's worker, with B's prefix, A's prefix, or none; and model routes on the front: refused
  # in the API's shape, nothing written.
  b_root = b["base_url"].rsplit("/r/", 1)[0]
  for url in [b["base_url"], f"{b_root}/r/{rid}", b_root, pool.url, f"{pool.url}/r/{rid}"]:
    status, text = post(url + "/v1/messages", GOOD, a["api_key"])
    assert status in (401, 404) and json.loads(text)["type"] == "error", (url, text)
    status, text = post(url + "/v1/chat/completions", GOOD_OAI, a["api_key"])
    assert status in (401, 404) and json.loads(text)["error"]["message"], (url, text)
  with pytest.raises(anthropic.AuthenticationError):
    anthropic.Anthropic(base_url=b["base_url"], api_key=a["api_key"], max_retries=0).messages.create(**GOOD)
  assert log_size(log_dir) == before
  assert get(pool.url + "/health")[1]["live_rollouts"] == 2
  for r in (a, b):
    assert pool.finish_rollout(r["rollout_id"])["calls"] == []
  assert get(pool.url + "/rollouts/nope", pool.admin_token)[0] == 404
  status, text = post(pool.url + "/rollouts", {"task_id": "t", "harness": "h", "rollout_id": rid},
                      token=pool.admin_token)
  assert status == 400 and "already exists" in json.loads(text)["error"]["message"]


def test_finish_waits_for_the_call_in_flight_on_the_rollouts_worker(pool):
  (r,) = _create(pool, 1)
  client = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  with concurrent.futures.ThreadPoolExecutor(1) as ex:
    call = ex.submit(client.messages.create, **GOOD)
    deadline = time.time() + LATENCY_S
    while get(pool.url + f"/rollouts/{r['rollout_id']}", pool.admin_token)[1]["inflight"] == 0:
      assert time.time() < deadline, "the call never got in flight"
    t = time.time()
    status, text = post(pool.url + f"/rollouts/{r['rollout_id']}/finish", {}, token=pool.admin_token)
    waited = time.time() - t
    assert call.result().content[0].text == "Working on it."
  summary = json.loads(text)
  assert status == 200 and summary["finished"] and summary["inflight"] == 0, summary
  assert [c["status"] for c in summary["calls"]] == ["ok"] and 0 < waited < LATENCY_S + 5
  assert len(log_calls(r["log_path"])) == 1


def test_workers_is_checked(tmp_path, template):
  with pytest.raises(ConfigError, match="shim.workers"):
    ShimConfig(log_dir="d", workers=0)
  with pytest.raises(ConfigError, match="ShimProcessPool"):
    ShimThread(ShimConfig(log_dir="d", workers=2), ScriptedBackend(template, [object()]), template)
  with pytest.raises(ConfigError, match="clawjax.engine"):
    ShimProcessPool(ShimConfig(log_dir="d", workers=2), WorkerSpec("embedded", "test-tiny"))
  with pytest.raises(ValueError, match="backend_options"):
    WorkerSpec("scripted", "qwen3", backend_options={"script": object()})
  cli = subprocess.run([sys.executable, "-m", "clawjax.serving", "--backend", "embedded", "--model",
                        "test-tiny", "--log-dir", str(tmp_path), "--workers", "2"],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)
  assert cli.returncode != 0 and "python -m clawjax.engine" in cli.stderr


def _wait_healthy(url, proc, restarts=0):
  deadline = time.time() + 60
  while True:
    try:
      status, health = get(url + "/health")
      if status == 200 and sum(w["restarts"] for w in health["workers"]) == restarts:
        return health
    except OSError:
      pass
    assert proc.poll() is None and time.time() < deadline, "shim did not come up"
    time.sleep(0.2)


def _play(r, k, acked, killed, errors, after_kill):
  """One rollout's harness: calls until its worker dies (then the next call's error, which must be the
  API's own), or until told to stop; the history grows as a harness's does."""
  a = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0, timeout=30)
  o = openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0, timeout=30)
  msgs = [{"role": "user", "content": f"rollout {k}: go"}]
  n = 0
  while not (killed.is_set() and acked[r["rollout_id"]] >= after_kill.get(r["rollout_id"], 1 << 30)):
    stream = (n + k) % 2 == 0
    use_anthropic = (n + k) % 3
    try:
      text = anthropic_text(a, msgs, stream, 64) if use_anthropic else openai_text(o, msgs, stream)
    except (anthropic.AuthenticationError, openai.AuthenticationError) as e:
      errors[r["rollout_id"]] = e  # The API's error: the end of this rollout.
      return
    except Exception as e:  # pylint: disable=broad-except  (a stream cut off raises the HTTP client's own)
      if not killed.is_set():
        errors[r["rollout_id"]] = e
        return
      continue  # Cut off by the kill (not acknowledged): the harness calls again.
    acked[r["rollout_id"]] += 1
    n += 1
    msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {n}"}]


@pytest.mark.slow
def test_kill_9_of_a_worker_loses_no_acknowledged_call_and_its_rollouts_get_the_apis_error(tmp_path):
  port = free_port()
  url = f"http://127.0.0.1:{port}"
  token = "workers-kill-test-token"
  proc = subprocess.Popen(
      [sys.executable, "-m", "clawjax.serving", "--backend", "scripted", "--model", "qwen3",
       "--backend-arg", f"script={_script(tmp_path)}", "--backend-arg", "latency_s=0.02", "--port",
       str(port), "--log-dir", str(tmp_path / "logs"), "--keepalive-s", "0.01", "--workers", "2"],
      env=dict(os.environ, PYTHONPATH=ROOT, CLAWJAX_ADMIN_TOKEN=token), stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL)
  try:
    health = _wait_healthy(url, proc)
    rollouts = [json.loads(post(url + "/rollouts", {"task_id": "t", "harness": "claude_code"}, token=token)[1])
                for _ in range(16)]
    victim = health["workers"][0]
    doomed = {r["rollout_id"] for r in rollouts if _port(r) == urllib.parse.urlsplit(victim["url"]).port}
    assert len(doomed) == 8
    acked = {r["rollout_id"]: 0 for r in rollouts}
    killed, errors, after_kill = threading.Event(), {}, {}
    players = [threading.Thread(target=_play, args=(r, k, acked, killed, errors, after_kill), daemon=True)
               for k, r in enumerate(rollouts)]
    for t in players:
      t.start()
    deadline = time.time() + 120
    while min(acked.values()) < 4 and time.time() < deadline:
      time.sleep(0.05)
    assert not errors, errors
    killed.set()
    os.kill(victim["pid"], signal.SIGKILL)  # Mid-flight: its calls are being generated, written, answered.
    # The other worker's rollouts go on: each makes 3 more calls.
    after_kill.update({rid: n + 3 for rid, n in acked.items() if rid not in doomed})
    for t in players:
      t.join(timeout=90)
    assert not any(t.is_alive() for t in players)
    assert set(errors) == doomed, {rid: repr(e) for rid, e in errors.items()}
    for e in errors.values():  # Anthropic's or OpenAI's own 401 body, saying why.
      body = e.body if isinstance(e, anthropic.APIStatusError) else {"error": e.body}
      assert e.status_code == 401 and "lost" in body["error"]["message"], body
    health = _wait_healthy(url, proc, restarts=1)
    assert health["workers"][0]["pid"] != victim["pid"]
    for r in rollouts:
      status, text = post(url + f"/rollouts/{r['rollout_id']}/finish", {}, token=token)
      summary = json.loads(text)
      assert status == 200, text
      data = open(r["log_path"], "rb").read()
      lines = data.split(b"\n")
      if lines[-1]:  # A last line without its line end: torn by the kill, never acknowledged.
        assert r["rollout_id"] in doomed
        lines.pop()
      (tmp_path / "whole.jsonl").write_bytes(b"".join(line + b"\n" for line in lines if line))
      loaded = calllog.load(tmp_path / "whole.jsonl")  # Every whole line is a valid record.
      ok = [c for c in loaded.calls.get(r["rollout_id"], []) if c.status == "ok"]
      if r["rollout_id"] in doomed:
        # Every call a client saw answered is on disk (plus, at most, the one answered as the worker died).
        assert acked[r["rollout_id"]] <= len(ok) <= acked[r["rollout_id"]] + 1
        assert "died (killed by SIGKILL)" in summary["failed"], summary
      else:  # Exactly once each.
        assert len(ok) == acked[r["rollout_id"]] == len(summary["calls"]) and summary["failed"] is None
    # The new worker takes new rollouts.
    fresh = [json.loads(post(url + "/rollouts", {"task_id": "t", "harness": "claude_code"}, token=token)[1])
             for _ in range(2)]
    for r in fresh:
      client = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
      assert anthropic_text(client, [{"role": "user", "content": "hi"}], False) == "Working on it."
    assert {_port(r) for r in fresh} == {_port(r) for r in rollouts}
  finally:
    proc.send_signal(signal.SIGTERM)
    try:
      assert proc.wait(timeout=60) == 0
    finally:
      if proc.poll() is None:
        proc.kill()
