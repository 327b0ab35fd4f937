"""The host side of the sandbox relay (UnixToTcp) on real sockets: a connection's relay outlives neither its
connection nor the relay, and no garbage collection ends one mid-transfer."""

import gc
import socket
import tempfile
import threading
import time

import pytest

from clawjax.harness import relay


@pytest.fixture
def upstream():
  """A listening TCP socket on 127.0.0.1 standing for the shim."""
  with socket.create_server(("127.0.0.1", 0)) as srv:
    srv.settimeout(10)
    yield srv


@pytest.fixture
def socket_path():
  with tempfile.TemporaryDirectory() as d:  # short: a socket path must fit in 108 bytes
    yield f"{d}/relay.sock"


def _connect(path: str) -> socket.socket:
  client = socket.socket(socket.AF_UNIX)
  client.settimeout(10)
  client.connect(path)
  return client


def _read_to_eof(sock: socket.socket) -> bytes:
  chunks = []
  while chunk := sock.recv(1 << 16):
    chunks.append(chunk)
  return b"".join(chunks)


def _asyncio_messages(caplog) -> list[str]:
  gc.collect()  # a task destroyed while pending is logged when it is collected
  return [r.getMessage() for r in caplog.records if r.name == "asyncio"]


def test_a_reply_after_the_client_half_closed_survives_a_garbage_collection(upstream, socket_path, caplog):
  # The client sends its request and half-closes; the upstream answers later (a long generation). In between,
  # no socket the relay's loop watches refers to the connection's relay, so only the relay itself keeps it
  # alive: a collection must not destroy it ("Task was destroyed but it is pending!") and lose the reply.
  with relay.UnixToTcp(socket_path, upstream.getsockname()[1]):
    client = _connect(socket_path)
    client.sendall(b"request")
    client.shutdown(socket.SHUT_WR)
    conn, _ = upstream.accept()
    conn.settimeout(10)
    assert _read_to_eof(conn) == b"request"  # the half-close went through to the upstream
    time.sleep(0.5)  # the relay goes idle, waiting for the reply
    gc.collect()
    conn.sendall(b"reply")
    conn.close()
    assert _read_to_eof(client) == b"reply"
    client.close()
  assert not _asyncio_messages(caplog)


def test_stopping_with_transfers_running_both_ways_ends_every_connection(upstream, socket_path, caplog):
  # Both peers send without reading, so each direction's relay waits on a full buffer when the relay stops:
  # the stop cancels both directions, closes both sides and leaves no task behind.
  port = upstream.getsockname()[1]
  with relay.UnixToTcp(socket_path, port):
    clients = [_connect(socket_path) for _ in range(3)]
    conns = [upstream.accept()[0] for _ in clients]
    for s in clients + conns:
      s.settimeout(30)
    ends = []
    senders = [threading.Thread(target=_send_until_closed, args=(s, ends), daemon=True) for s in clients + conns]
    for t in senders:
      t.start()
    for s in clients + conns:  # each direction has carried data before the stop
      assert s.recv(1 << 16)
  for t in senders:
    t.join(30)
  assert ends == ["closed"] * len(senders)  # every peer saw its connection closed, none timed out
  assert not [t.name for t in threading.enumerate() if t.name == f"relay-{port}"]
  for s in clients + conns:
    s.close()
  assert not _asyncio_messages(caplog)


def _send_until_closed(sock: socket.socket, ends: list[str]) -> None:
  block = b"x" * (1 << 20)
  try:
    while True:
      sock.sendall(block)
  except TimeoutError:
    ends.append("timed out")
  except OSError:
    ends.append("closed")
