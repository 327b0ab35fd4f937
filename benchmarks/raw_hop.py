"""A second floor for `shim_overhead.py`: the bare hop without an HTTP library.

The benchmark's own hop is aiohttp on uvloop, built like the shim; this one forwards the same request
with uvloop's protocols and HTTP/1.1 read by hand, which is about as little as a Python process can do
per proxied call: find the end of the head, take Content-Length bytes, write one buffer. What it adds
over a direct call is loopback, the extra process and the event loop's own wake-ups; the shim cannot
add less than this whatever its HTTP layer.

It is a measuring instrument, not a server: it reads only what the benchmark's client and engine
stand-in send (Content-Length bodies, keep-alive, no chunked encoding) and refuses anything else.

  python benchmarks/raw_hop.py PORT ENGINE_PORT   (the benchmark starts it with --raw-hop)
"""

from __future__ import annotations

import asyncio
import sys

import orjson
import uvloop

_EVENTS = (b'event: message_start\ndata: {"type":"message_start"}\n\n'
           b'event: message_stop\ndata: {"type":"message_stop"}\n\n')


def _content_length(head: bytes) -> int:
  at = head.find(b"content-length:")
  if at < 0:
    return 0
  line_end = head.find(b"\r\n", at)
  return int(head[at + 15:line_end if line_end >= 0 else None])


class _MessageReader(asyncio.Protocol):
  """Splits a connection's bytes into HTTP/1.1 messages (requests or responses) with Content-Length
  bodies, handing each (first line, body) to `on_message`."""

  def __init__(self):
    self.buf = bytearray()
    self.transport: asyncio.Transport | None = None

  def connection_made(self, transport: asyncio.BaseTransport) -> None:
    self.transport = transport

  def data_received(self, data: bytes) -> None:
    self.buf += data
    while (end := self.buf.find(b"\r\n\r\n")) >= 0:
      head = bytes(self.buf[:end]).lower()
      if b"transfer-encoding:" in head:
        raise ValueError("raw_hop reads Content-Length bodies only")
      start, length = end + 4, _content_length(head)
      if len(self.buf) < start + length:
        return
      body = bytes(self.buf[start:start + length])
      del self.buf[:start + length]
      self.on_message(head.split(b"\r\n", 1)[0], body)

  def on_message(self, first_line: bytes, body: bytes) -> None:
    raise NotImplementedError


class _EngineConnection(_MessageReader):
  """A keep-alive connection to the engine, one call in flight."""

  def __init__(self):
    super().__init__()
    self.answer: asyncio.Future | None = None

  async def post(self, path: bytes, body: bytes) -> bytes:
    self.answer = asyncio.get_running_loop().create_future()
    self.transport.write(b"POST %b HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (path, len(body), body))
    return await self.answer

  def on_message(self, first_line: bytes, body: bytes) -> None:
    self.answer.set_result(body)

  def connection_lost(self, exc: Exception | None) -> None:
    if self.answer is not None and not self.answer.done():
      self.answer.set_exception(ConnectionError("the engine closed the connection"))


def _response(content_type: bytes, body: bytes) -> bytes:
  return b"HTTP/1.1 200 OK\r\nContent-Type: %b\r\nContent-Length: %d\r\n\r\n%b" % (
      content_type, len(body), body)


class _Hop:
  """Serves /configure (the engine request to forward), /health and /v1/messages like the aiohttp hop."""

  def __init__(self, engine_port: int):
    self.engine_port = engine_port
    self.idle: list[_EngineConnection] = []  # (The engine closes a connection idle for 75 s.)
    self.payload = b""

  async def forward(self) -> bytes:
    while self.idle and self.idle[-1].transport.is_closing():
      self.idle.pop()
    conn = self.idle.pop() if self.idle else (await asyncio.get_running_loop().create_connection(
        _EngineConnection, "127.0.0.1", self.engine_port))[1]
    answer = await conn.post(b"/generate", self.payload)
    self.idle.append(conn)
    orjson.loads(answer)  # (As the aiohttp hop parses it.)
    return _response(b"text/event-stream", _EVENTS)


class _ClientConnection(_MessageReader):
  """One connection from the benchmark's client."""

  def __init__(self, hop: _Hop):
    super().__init__()
    self.hop = hop

  def on_message(self, first_line: bytes, body: bytes) -> None:
    path = first_line.split(b" ")[1]
    if path.startswith(b"/v1/messages"):
      asyncio.ensure_future(self.hop.forward()).add_done_callback(self.reply)
      return
    if path == b"/configure":
      self.hop.payload = body
    self.transport.write(_response(b"application/json", b"{}"))

  def reply(self, forwarded: asyncio.Future) -> None:
    if forwarded.exception() is None:
      self.transport.write(forwarded.result())
    else:  # The client sees the failure as a dropped connection.
      self.transport.close()


async def serve(port: int, engine_port: int) -> None:
  hop = _Hop(engine_port)
  await asyncio.get_running_loop().create_server(lambda: _ClientConnection(hop), "127.0.0.1", port)
  await asyncio.Event().wait()  # Until terminated.


if __name__ == "__main__":
  uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
