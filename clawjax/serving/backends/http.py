"""Shared HTTP plumbing for backends that are remote engine servers (sglang, vllm).

Routes: `--backend-arg routed_experts=TOP_K` asks the engine for the experts its MoE layers chose at
every position of each call (the positions the call's log record needs: PromptIds.routes_from on);
serving/backends/routes.py decodes them.

Keys, as the engines take them (`--backend-arg api_key=... admin_api_key=...`): `api_key` is sent as
`Authorization: Bearer` on every request (SGLang's and vLLM's `--api-key`); `admin_api_key` on the
control requests only (the weight update: SGLang's `--admin-api-key`, and the admin token of
`python -m clawjax.engine`). SGLang checks its admin routes against the admin key when it has one, else
against the api key; so does this client.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from clawjax.serving.backends.base import Backend, BackendError


_JSON = "application/json"


def json_with_ids(key: str, ids_text: bytes, rest: dict[str, Any]) -> bytes:
  """A JSON object whose first field `key` holds an already encoded id array."""
  tail = json.dumps(rest, separators=(",", ":")).encode()
  return b"".join((b'{"', key.encode(), b'":', ids_text, b"," + tail[1:] if len(tail) > 2 else b"}"))


# SGLang's router sends requests with the same key to the same worker (its `--policy manual`).
ROUTING_KEY_HEADER = "x-smg-routing-key"


def _headers(key: str | None) -> dict[str, str]:
  return {"Content-Type": _JSON, **({"Authorization": f"Bearer {key}"} if key else {})}


def _parse_answer(body: bytes) -> Any:
  # orjson is ~5x faster on an 8K-token answer's log-prob triples; `json` also takes the NaN /
  # Infinity literals some engines write, so the parser can name them as bad log-probs.
  try:
    return orjson.loads(body)
  except orjson.JSONDecodeError:
    return json.loads(body)


def _status_error(where: str, status: int, body: bytes) -> BackendError:
  # 429/503/529: the engine is overloaded or not up yet, which the harness retries.
  return BackendError(f"{where} -> HTTP {status}: {body[:500]!r}",
                      status=503 if status in (429, 503, 529) else 500, http_status=status)


def _transport_error(where: str, e: Exception) -> BackendError:
  # A refused, dropped or timed-out connection (also one dropped mid-answer, a payload error) is
  # retryable; anything else the client library raises is not.
  retry = isinstance(e, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError))
  return BackendError(f"{where}: {type(e).__name__}: {e}", status=503 if retry else 500)


async def sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
  """The data of each server-sent event in `content`, in order (its `data:` lines joined by newlines).

  Splits lines itself rather than using `content.readline`: aiohttp refuses a line longer than twice its
  read buffer (128 KiB by default in older versions, 512 KiB in 3.14), and one cumulative SGLang chunk
  is ~300 KB at 8K tokens. A line cut off by the end of the stream is dropped; complete data lines not
  yet closed by a blank line are kept.
  """
  buf, scanned, data = bytearray(), 0, []
  async for block in content.iter_any():
    buf += block
    start = 0
    # Searching only the new bytes keeps a long line arriving in many blocks linear.
    while (end := buf.find(b"\n", scanned)) >= 0:
      line = buf[start:end].rstrip(b"\r")
      start = scanned = end + 1
      if not line:
        if data:
          yield data[0] if len(data) == 1 else b"\n".join(data)
          data = []
      elif line.startswith(b"data:"):
        data.append(line[6:] if line.startswith(b"data: ") else line[5:])
      # Other fields (event:, id:, retry:) and comments (":...") carry nothing a backend uses.
    del buf[:start]
    scanned = len(buf)
  if data:
    yield b"\n".join(data)


class HttpBackend(Backend):
  """A Backend talking JSON over HTTP to `url`. One aiohttp session, created on first use in the loop
  that uses it. Connection failures and 503/529/429 answers are `BackendError(503)` (retryable)."""

  health_path = "/health"

  def __init__(self, url: str | None, timeout_s: float | str = 3600.0, max_connections: int | str = 1024,
               api_key: str | None = None, admin_api_key: str | None = None, routed_experts: int | str = 0):
    """`routed_experts`: the MoE model's experts per token (top_k), to ask the engine for each call's
    routes (serving/backends/routes.py); 0: not asked."""
    if not url:
      raise ValueError(f"{type(self).__name__}: --backend-url is required")
    self.url = url.rstrip("/")
    self.routes_top_k = int(routed_experts)
    self._headers = _headers(api_key)
    self._admin_headers = _headers(admin_api_key or api_key)
    self.timeout = aiohttp.ClientTimeout(total=float(timeout_s))
    self.max_connections = int(max_connections)
    self._session: aiohttp.ClientSession | None = None
    self._served: dict[str, Any] | None = None  # The first model of /v1/models, once known.
    self._context: int | None = None  # The engine's context length, once settled (may be unknown).
    self._context_settled = False

  def session(self) -> aiohttp.ClientSession:
    if self._session is None or self._session.closed:
      self._session = aiohttp.ClientSession(
          timeout=self.timeout, connector=aiohttp.TCPConnector(limit=self.max_connections))
    return self._session

  def _request_headers(self, admin: bool, routing_key: str | None) -> dict[str, str]:
    headers = self._admin_headers if admin else self._headers
    return {**headers, ROUTING_KEY_HEADER: routing_key} if routing_key else headers

  async def request(self, method: str, path: str, payload: Any = None, *, body: bytes | None = None,
                    admin: bool = False, routing_key: str | None = None) -> Any:
    """JSON in (`payload`, or `body` already encoded), JSON out (a 2xx answer that is not JSON comes back
    as its text); raises BackendError naming the endpoint on any failure. `admin`: a control request;
    `routing_key`: sent for SGLang's router (PromptIds.routing_key)."""
    where = f"{method} {self.url}{path}"
    data = body if body is not None else None if payload is None else json.dumps(payload)
    try:
      async with self.session().request(method, self.url + path, data=data,
                                        headers=self._request_headers(admin, routing_key)) as resp:
        body = await resp.read()
        if resp.status >= 400:
          raise _status_error(where, resp.status, body)
        if not body:
          return None
        try:
          return _parse_answer(body)
        except ValueError:
          # Some engine endpoints answer success in plain text (SGLang's /flush_cache).
          return body.decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
      raise _transport_error(where, e) from None

  async def stream(self, method: str, path: str, *, body: bytes,
                   routing_key: str | None = None) -> AsyncIterator[Any]:
    """`request` for an answer that is a server-sent event stream: yields each event's data as parsed
    JSON, until a `[DONE]` event or the end of the stream (whether the answer was complete is for the
    caller to tell from the events). Raises BackendError as `request` does; a connection dropped
    mid-stream is BackendError(503). Iterate under `contextlib.aclosing`, so that leaving early closes
    the response at once."""
    where = f"{method} {self.url}{path}"
    try:
      async with self.session().request(method, self.url + path, data=body,
                                        headers=self._request_headers(False, routing_key)) as resp:
        if resp.status >= 400:
          raise _status_error(where, resp.status, await resp.read())
        async with contextlib.aclosing(sse_data(resp.content)) as events:
          async for data in events:
            if data.strip() == b"[DONE]":
              return
            try:
              event = _parse_answer(data)
            except ValueError as e:
              raise BackendError(f"{where}: event not JSON ({e}): {bytes(data[:300])!r}") from None
            yield event
    except (aiohttp.ClientError, TimeoutError) as e:
      raise _transport_error(where, e) from None

  async def served_model_card(self) -> dict[str, Any]:
    """The engine's first entry of `GET /v1/models` (vLLM and SGLang both serve it), asked once."""
    if self._served is None:
      body = await self.request("GET", "/v1/models")
      try:
        card = body["data"][0]
        if not isinstance(card, dict):
          raise TypeError(type(card).__name__)
      except (KeyError, IndexError, TypeError):
        raise BackendError(f"{self.url}/v1/models: no model listed in {str(body)[:300]}") from None
      self._served = card
    return self._served

  async def context_length(self) -> int | None:
    # vLLM lists `max_model_len` (its --max-model-len). Without the field, or the endpoint, the limit
    # stays unknown; an engine not up yet is asked again on the next call.
    if not self._context_settled:
      try:
        limit = (await self.served_model_card()).get("max_model_len")
      except BackendError as e:
        if e.overloaded:
          return None
        limit = None
      self._context = limit if isinstance(limit, int) and limit > 0 else None
      self._context_settled = True
    return self._context

  async def health(self) -> bool:
    try:
      await self.request("GET", self.health_path)
    except BackendError:
      return False
    return True

  async def close(self) -> None:
    if self._session is not None:
      await self._session.close()
