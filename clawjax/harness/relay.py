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
import os
import signal
import sys
import threading


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
  """Copies one direction; at EOF half-closes the other side so responses still flow back."""
  try:
    while data := await reader.read(1 << 16):
      writer.write(data)
      await writer.drain()
    if writer.can_write_eof():
      writer.write_eof()
  except (ConnectionError, asyncio.CancelledError):
    pass


async def _splice(client_r, client_w, open_upstream) -> None:
  try:
    up_r, up_w = await open_upstream()
  except OSError:
    client_w.close()
    return
  try:
    await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
  except asyncio.CancelledError:
    # The relay is ending with the connection still open (the shim keeps it alive after the harness
    # exits) and asyncio cancels this handler: end it as a finished one, since a cancelled handler makes
    # the stream server print a traceback into the harness's stderr.
    pass
  finally:
    for w in (up_w, client_w):
      try:
        w.close()
      except RuntimeError:  # the loop is already closing
        pass


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
          lambda r, w: _splice(r, w, lambda: asyncio.open_connection(self.host, self.port)),
          path=self.socket_path)
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
      tasks = asyncio.all_tasks() - {asyncio.current_task()}
      for task in tasks:
        task.cancel()
      # Let the connections' handlers finish their cancellation (closing both sides) before the loop
      # stops; a handler left pending is destroyed with the loop and asyncio logs it as an error.
      if tasks:
        await asyncio.wait(tasks, timeout=5)

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
        lambda r, w, sock=sock: _splice(r, w, lambda: asyncio.open_unix_connection(sock)),
        host="127.0.0.1", port=port))
  proc = await asyncio.create_subprocess_exec(*argv)
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGTERM, signal.SIGINT):
    loop.add_signal_handler(sig, proc.send_signal, sig)
  code = await proc.wait()
  for s in servers:
    s.close()
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
