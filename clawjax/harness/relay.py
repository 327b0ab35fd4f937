"""Loopback-only network for a sandboxed harness: TCP ports relayed through Unix sockets.

A bubblewrap sandbox with its own network namespace has a loopback interface and nothing else, so the
harness cannot reach the shim on the host's 127.0.0.1. A Unix socket is a file, and files cross
namespaces: on the host, `UnixToTcp` accepts on a socket file and connects to 127.0.0.1:PORT; inside
the sandbox, this module's `main` listens on 127.0.0.1:PORT of the sandbox's own loopback, forwards each
connection to the socket file, and runs the harness as its child. The harness sees the shim at the
same URL as outside, and no other address is reachable.

Inside use: `python -m clawjax.harness.relay --port PORT=SOCKET ... -- ARGV...` (exits with ARGV's
status).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable

# Opens the connection a relayed connection goes to (the shim's TCP port, or a socket file).
_OpenUpstream = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
  """Copies one direction; at EOF half-closes the other side so responses still flow back."""
  while data := await reader.read(1 << 16):
    writer.write(data)
    await writer.drain()
  if writer.can_write_eof():
    writer.write_eof()


async def _splice(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, open_upstream: _OpenUpstream) -> None:
  """Relays one connection both ways until both directions end, an error in either ending both; closes both
  sides once what they buffered is sent, or at once (dropping it) when cancelled."""
  writers = [client_w]
  try:
    try:
      up_r, up_w = await open_upstream()
      writers.append(up_w)
      async with asyncio.TaskGroup() as pipes:
        pipes.create_task(_pipe(client_r, up_w))
        pipes.create_task(_pipe(up_r, client_w))
    except* OSError:  # refused, reset or broken: the connection ends both ways
      pass
    for writer in writers:
      writer.close()
    for writer in writers:
      with contextlib.suppress(OSError):
        await writer.wait_closed()
  finally:
    # Nothing left to do once closed. Cancelled (the relay ends), a peer that stopped reading would otherwise
    # keep its socket open, waiting for its buffer to drain, past the end of the loop.
    for writer in writers:
      writer.transport.abort()


def _relay_each(open_upstream: _OpenUpstream) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], None]:
  """A stream server's callback relaying each connection in its own task, held until it ends: once a client has
  half-closed or gone, no socket the loop watches refers to its relay, and the garbage collector would destroy
  the pending task mid-transfer ("Task was destroyed but it is pending!", the reply lost)."""
  held: set[asyncio.Task] = set()

  def accept(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    task = asyncio.get_running_loop().create_task(_splice(client_r, client_w, open_upstream))
    held.add(task)
    task.add_done_callback(held.discard)

  return accept


async def _end_other_tasks() -> None:
  """Cancels every other task of the running loop and waits for them, until none is left (a connection accepted
  just before its server closed gets its handler while the others end): a task still pending when the loop
  closes is destroyed with it, and asyncio logs that as an error."""
  while tasks := asyncio.all_tasks() - {asyncio.current_task()}:
    for task in tasks:
      task.cancel()
    await asyncio.wait(tasks)


class UnixToTcp:
  """Host side: a Unix socket at `socket_path` whose connections are forwarded to 127.0.0.1:`port`.

  Runs its own event loop in a daemon thread; use as a context manager around the sandboxed run.
  """

  def __init__(self, socket_path: str, port: int, host: str = "127.0.0.1"):
    self.socket_path, self.port, self.host = socket_path, port, host
    self._loop = asyncio.new_event_loop()
    self._ready = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True, name=f"relay-{port}")
    self._server: asyncio.AbstractServer | None = None

  def _run(self) -> None:
    asyncio.set_event_loop(self._loop)

    async def start() -> None:
      self._server = await asyncio.start_unix_server(
          _relay_each(lambda: asyncio.open_connection(self.host, self.port)), path=self.socket_path)
      self._ready.set()

    self._loop.run_until_complete(start())
    self._loop.run_forever()

  def __enter__(self) -> "UnixToTcp":
    self._thread.start()
    if not self._ready.wait(10):
      raise RuntimeError(f"relay socket {self.socket_path} did not come up")
    return self

  def __exit__(self, *exc) -> None:
    async def stop() -> None:
      self._server.close()
      await _end_other_tasks()

    asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
    self._loop.call_soon_threadsafe(self._loop.stop)
    self._thread.join(10)
    self._loop.close()
    if os.path.exists(self.socket_path):
      os.unlink(self.socket_path)


async def _inside(ports: dict[int, str], argv: list[str]) -> int:
  servers = []
  for port, sock in ports.items():
    servers.append(await asyncio.start_server(
        _relay_each(lambda sock=sock: asyncio.open_unix_connection(sock)),
        host="127.0.0.1", port=port))
  proc = await asyncio.create_subprocess_exec(*argv)
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGTERM, signal.SIGINT):
    loop.add_signal_handler(sig, proc.send_signal, sig)
  code = await proc.wait()
  for s in servers:
    s.close()
  await _end_other_tasks()
  return code if code >= 0 else 128 - code


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if "--" not in argv:
    raise SystemExit("usage: python -m clawjax.harness.relay --port PORT=SOCKET ... -- ARGV...")
  split = argv.index("--")
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", action="append", default=[], help="PORT=SOCKET_PATH")
  args = parser.parse_args(argv[:split])
  ports = {}
  for item in args.port:
    port, _, sock = item.partition("=")
    ports[int(port)] = sock
  return asyncio.run(_inside(ports, argv[split + 1:]))


if __name__ == "__main__":
  sys.exit(main())
