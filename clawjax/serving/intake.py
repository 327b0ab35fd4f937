"""What the shim takes from a client, bounded before any parsing or tokenising: open connections per
client address, the time a request may take to arrive, the body's size, and the JSON's nesting depth.

The header phase is bounded by aiohttp's keep-alive timer (a connection that has not sent a whole
request within it is closed; the server sets it to `ShimConfig.read_timeout_s`); `read_body` bounds the
body. `ClientCappedSite` is aiohttp's TCP site with a count of open connections per client address.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
from typing import Any

import orjson
from aiohttp import web

from clawjax.serving import errors
from clawjax.serving.errors import ApiError


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
  """The request's body: 413 when its Content-Length or what arrives exceeds `max_bytes` (nothing more
  is read), 408 when it has not arrived within `timeout_s`."""
  declared = request.content_length
  if declared is not None and declared > max_bytes:
    raise ApiError(errors.TOO_LARGE, f"request body of {declared} bytes exceeds the limit of {max_bytes} "
                   "bytes")
  try:
    async with asyncio.timeout(timeout_s):
      return await request.read()  # (aiohttp stops reading past the app's client_max_size = max_bytes.)
  except web.HTTPRequestEntityTooLarge:
    raise ApiError(errors.TOO_LARGE, f"request body exceeds the limit of {max_bytes} bytes") from None
  except TimeoutError:
    raise ApiError(errors.TIMEOUT, f"request body not received within {timeout_s:g} s") from None


async def read_json(request: web.Request, max_bytes: int, timeout_s: float, max_depth: int) -> Any:
  """The request's JSON body, read by `read_body` and decoded by `decode_json` under their limits."""
  return decode_json(await read_body(request, max_bytes, timeout_s), max_depth)


def _reject_constant(name: str) -> Any:
  raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes, max_depth: int) -> Any:
  """A request body's JSON, nested at most `max_depth` levels (400 otherwise, or when not JSON).

  orjson parses an ~80 KB Claude Code body 2-3x faster than `json` and, like us, rejects NaN/Infinity;
  but it also rejects lone UTF-16 surrogate escapes, which a JavaScript client sends when it cut a tool
  output inside an emoji. Those bodies take the `json` path, and each lone surrogate becomes U+FFFD (what
  any tokenizer needs: it encodes UTF-8). orjson itself stops at 1024 levels; `json` at Python's
  recursion limit, which is a 400 here too.
  """
  try:
    body = orjson.loads(raw)
  except orjson.JSONDecodeError:
    try:
      body = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
      raise _too_deep(max_depth) from None
    except ValueError as e:
      raise ApiError(errors.INVALID, f"request body is not valid JSON: {e}") from None
    _check_depth(body, max_depth)
    return _without_lone_surrogates(body)
  _check_depth(body, max_depth)
  return body


def _too_deep(max_depth: int) -> ApiError:
  return ApiError(errors.INVALID, f"request body nests deeper than {max_depth} levels "
                  "(ShimConfig.max_json_depth)")


def _check_depth(body: Any, max_depth: int) -> None:
  """Level by level: a list comprehension per level costs ~50 us on a Claude Code body."""
  level = [body] if isinstance(body, (dict, list)) else []
  for _ in range(max_depth):
    level = [c for v in level for c in (v.values() if type(v) is dict else v)  # pylint: disable=unidiomatic-typecheck
             if type(c) is dict or type(c) is list]  # pylint: disable=unidiomatic-typecheck
    if not level:
      return
  if level:
    raise _too_deep(max_depth)


def _without_lone_surrogates(x: Any) -> Any:
  if isinstance(x, str):
    # json.loads already joined the valid pairs: what is left in the surrogate range is lone.
    return x.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
  if isinstance(x, list):
    return [_without_lone_surrogates(v) for v in x]
  if isinstance(x, dict):
    return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in x.items()}
  return x


class _ClientConnection(asyncio.Protocol):
  """Stands in front of aiohttp's protocol for one connection: counts its client's open connections and
  closes one past the cap at once, before it is read."""

  def __init__(self, inner: asyncio.Protocol, open_by_client: collections.Counter, cap: int):
    self.inner, self.open_by_client, self.cap = inner, open_by_client, cap
    self.client: str | None = None
    self.refused = False

  def connection_made(self, transport: asyncio.BaseTransport) -> None:
    peer = transport.get_extra_info("peername")
    self.client = peer[0] if isinstance(peer, tuple) else str(peer)
    if self.open_by_client[self.client] >= self.cap:
      self.refused = True
      transport.abort()
      return
    self.open_by_client[self.client] += 1
    self.inner.connection_made(transport)

  def connection_lost(self, exc: Exception | None) -> None:
    if self.refused:
      return
    self.open_by_client[self.client] -= 1
    if not self.open_by_client[self.client]:
      del self.open_by_client[self.client]
    self.inner.connection_lost(exc)

  def data_received(self, data: bytes) -> None:
    if not self.refused:
      self.inner.data_received(data)

  def eof_received(self) -> bool | None:
    return None if self.refused else self.inner.eof_received()

  def pause_writing(self) -> None:
    self.inner.pause_writing()

  def resume_writing(self) -> None:
    self.inner.resume_writing()


class ClientCappedSite(web.BaseSite):
  """aiohttp's TCP site, with at most `max_per_client` open connections per client address. It listens
  on `host`:`port`, or on `sock` when given (a listening socket made by another process: a shim
  worker's, which the front holds)."""

  def __init__(self, runner: web.BaseRunner, host: str, port: int, max_per_client: int,
               sock: socket.socket | None = None):
    super().__init__(runner)
    self.host, self.port, self.max_per_client, self.sock = host, port, max_per_client, sock
    self.open_by_client: collections.Counter[str] = collections.Counter()

  @property
  def name(self) -> str:
    return f"http://{self.host}:{self.port}"

  async def start(self) -> None:
    await super().start()
    server = self._runner.server
    where = {"sock": self.sock} if self.sock is not None else {"host": self.host, "port": self.port}
    self._server = await asyncio.get_running_loop().create_server(
        lambda: _ClientConnection(server(), self.open_by_client, self.max_per_client), **where)
