"""Bounded intake: slow clients time out, one client's open connections are capped, an oversized body is
refused from its Content-Length before it is sent, and deep JSON is a 400; all in the dialect's shape,
nothing written."""
import json
import socket
import time
import urllib.parse

import anthropic
import pytest

from tests.serving.helpers import FINAL_TURN, GOOD, GOOD_OAI, log_size, post


def _connect(url: str) -> socket.socket:
  parts = urllib.parse.urlsplit(url)
  return socket.create_connection((parts.hostname, parts.port), timeout=30)


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
  """(status, body) of one HTTP/1.1 response with a Content-Length."""
  data = b""
  while b"\r\n\r\n" not in data:
    chunk = sock.recv(65536)
    assert chunk, f"connection closed after {data!r}"
    data += chunk
  head, _, body = data.partition(b"\r\n\r\n")
  length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:"))
  while len(body) < length:
    body += sock.recv(65536)
  return int(head.split(b" ")[1]), body


def _closed_within(sock: socket.socket, seconds: float) -> float:
  """Seconds until the server closed `sock` (reading what it sent meanwhile)."""
  t0 = time.monotonic()
  sock.settimeout(seconds)
  try:
    while sock.recv(65536):
      pass
  except ConnectionResetError:
    pass
  return time.monotonic() - t0


def test_slow_headers_and_slow_body_time_out(make_shim, tmp_path):
  shim = make_shim([FINAL_TURN], read_timeout_s=1.0)
  r = shim.create_rollout("t", "claude_code")
  path = urllib.parse.urlsplit(r["base_url"]).path + "/v1/messages"
  # Headers that never finish: the connection is closed after the timeout (not held for minutes).
  slow = _connect(shim.url)
  slow.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode())
  assert _closed_within(slow, 20) < 5
  # Headers, then half the body: 408 in the Anthropic shape once the timeout passes.
  body = json.dumps(GOOD).encode()
  slow = _connect(shim.url)
  slow.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nx-api-key: {r['api_key']}\r\n"
               f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
               + body[:10])
  t0 = time.monotonic()
  status, text = _read_response(slow)
  assert status == 408 and time.monotonic() - t0 < 5
  err = json.loads(text)
  assert err["type"] == "error" and "not received within 1 s" in err["error"]["message"]
  slow.close()
  # An idle keep-alive connection is let go too.
  idle = _connect(shim.url)
  assert _closed_within(idle, 20) < 5
  assert log_size(tmp_path / "logs") == 0
  assert post(r["base_url"] + "/v1/messages", GOOD, r["api_key"])[0] == 200


def test_open_connections_per_client_are_capped(make_shim):
  shim = make_shim([FINAL_TURN], max_connections_per_client=3)
  r = shim.create_rollout("t", "claude_code")
  held = [_connect(shim.url) for _ in range(3)]
  time.sleep(0.2)
  extra = _connect(shim.url)  # Accepted by the kernel, closed by the shim before it is read.
  assert _closed_within(extra, 10) < 5
  held.pop().close()
  time.sleep(0.2)
  assert post(r["base_url"] + "/v1/messages", GOOD, r["api_key"])[0] == 200
  for s in held:
    s.close()


@pytest.mark.parametrize("api", ["anthropic", "openai", "responses"])
def test_oversized_body_is_refused_from_its_content_length(make_shim, tmp_path, api):
  """A 27 MB body declared over a 1 MB limit: 413 at once, before the body is sent or parsed."""
  shim = make_shim([FINAL_TURN], max_body_bytes=1 << 20)
  r = shim.create_rollout("t", "claude_code")
  path = urllib.parse.urlsplit(r["base_url"]).path + {"anthropic": "/v1/messages", "openai": "/v1/chat/completions",
                                                     "responses": "/v1/responses"}[api]
  sock = _connect(shim.url)
  t0 = time.monotonic()
  sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {r['api_key']}\r\n"
               f"content-type: application/json\r\ncontent-length: {27 << 20}\r\n\r\n".encode())
  status, text = _read_response(sock)
  assert status == 413 and time.monotonic() - t0 < 2
  err = json.loads(text)
  assert (err["error"]["type"] == "request_too_large" if api == "anthropic"
          else err["error"]["type"] == "invalid_request_error")
  assert str(27 << 20) in err["error"]["message"]
  sock.close()
  # A chunked body without a length is cut off once it passes the limit.
  sock = _connect(shim.url)
  sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {r['api_key']}\r\n"
               "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".encode())
  piece = b"x" * 65536
  for _ in range(20):
    try:
      sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
    except OSError:
      break
  status, _ = _read_response(sock)
  assert status == 413
  sock.close()
  assert log_size(tmp_path / "logs") == 0


@pytest.mark.parametrize("depth", [129, 2_000, 100_000])
def test_deep_json_is_400_in_both_dialects(make_shim, tmp_path, depth):
  shim = make_shim([FINAL_TURN])
  r = shim.create_rollout("t", "claude_code")
  deep = b"[" * depth + b"]" * depth
  for url, body in [(r["base_url"] + "/v1/messages", GOOD), (r["openai_base_url"] + "/chat/completions",
                                                            GOOD_OAI)]:
    raw = json.dumps(body).encode()[:-1] + b', "metadata": ' + deep + b"}"
    status, text = post(url, None, r["api_key"], raw=raw)
    assert status == 400, text
    assert "nests deeper than 128 levels" in json.loads(text)["error"]["message"]
  assert log_size(tmp_path / "logs") == 0
  # Within the limit, an unknown field nested 100 deep is ignored as before.
  ok = json.dumps(GOOD).encode()[:-1] + b', "metadata": ' + b"[" * 100 + b"]" * 100 + b"}"
  assert post(r["base_url"] + "/v1/messages", None, r["api_key"], raw=ok)[0] == 200
  client = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
  assert client.messages.create(**GOOD).content[0].text == FINAL_TURN.text
