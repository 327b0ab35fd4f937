"""Shared HTTP plumbing for backends that are remote engine servers (sglang, vllm)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson

from clawjax.serving.backends.base import Backend, BackendError


_JSON_HEADERS = {"Content-Type": "application/json"}


def json_with_ids(key: str, ids_text: bytes, rest: dict[str, Any]) -> bytes:
  """A JSON object whose first field `key` holds an already encoded id array."""
  tail = json.dumps(rest, separators=(",", ":")).encode()
  return b"".join((b'{"', key.encode(), b'":', ids_text, b"," + tail[1:] if len(tail) > 2 else b"}"))


def _parse_answer(body: bytes) -> Any:
  # orjson is ~5x faster on an 8K-token answer's log-prob triples; `json` also takes the NaN /
  # Infinity literals some engines write, so the parser can name them as bad log-probs.
  try:
    return orjson.loads(body)
  except orjson.JSONDecodeError:
    return json.loads(body)


class HttpBackend(Backend):
  """A Backend talking JSON over HTTP to `url`. One aiohttp session, created on first use in the loop
  that uses it. Connection failures and 503/529/429 answers are `BackendError(503)` (retryable)."""

  health_path = "/health"

  def __init__(self, url: str | None, timeout_s: float | str = 3600.0, max_connections: int | str = 1024):
    if not url:
      raise ValueError(f"{type(self).__name__}: --backend-url is required")
    self.url = url.rstrip("/")
    self.timeout = aiohttp.ClientTimeout(total=float(timeout_s))
    self.max_connections = int(max_connections)
    self._session: aiohttp.ClientSession | None = None

  def session(self) -> aiohttp.ClientSession:
    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(
          timeout=self.timeout, connector=aiohttp.TCPConnector(limit=self.max_connections))
    return self._session

  async def request(self, method: str, path: str, payload: Any = None, *, body: bytes | None = None
                    ) -> Any:
    """JSON in (`payload`, or `body` already encoded), JSON out (a 2xx answer that is not JSON comes back
    as its text); raises BackendError naming the endpoint on any failure."""
    where = f"{method} {self.url}{path}"
    data = body if body is not None else None if payload is None else json.dumps(payload)
    try:
      async with self.session().request(method, self.url + path, data=data,
                                        headers=_JSON_HEADERS) as resp:
        body = await resp.read()
        if resp.status >= 400:
          status = 503 if resp.status in (429, 503, 529) else 500
          raise BackendError(f"{where} -> HTTP {resp.status}: {body[:500]!r}", status=status)
        if not body:
          return None
        try:
          return _parse_answer(body)
        except ValueError:
          # Some engine endpoints answer success in plain text (SGLang's /flush_cache).
          return body.decode("utf-8", "replace")
    except (aiohttp.ClientConnectionError, TimeoutError) as e:
      raise BackendError(f"{where}: {type(e).__name__}: {e}", status=503) from None
    except (aiohttp.ClientError, ValueError) as e:
      raise BackendError(f"{where}: {type(e).__name__}: {e}", status=500) from None

  async def health(self) -> bool:
    try:
      await self.request("GET", self.health_path)
    except BackendError:
      return False
    return True

  async def close(self) -> None:
    if self._session is not None:
      await self._session.close()
