"""The admin token: the one credential for the control routes of the shim (create, finish and inspect
rollouts) and of the engine server (weight update, cache flush). Only the trainer holds it; a sandboxed
harness gets its rollout's key and nothing else.

Clients send `Authorization: Bearer TOKEN` (what SGLang's `--admin-api-key` expects too). A server takes
the token from $CLAWJAX_ADMIN_TOKEN when set, otherwise makes a fresh one and writes it, mode 0600, to a
file its owner reads. Standard library only: the shim, the engine server and the harness runner share
it.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Mapping

ADMIN_TOKEN_ENV = "CLAWJAX_ADMIN_TOKEN"


def new_token() -> str:
  """256 random bits, URL-safe."""
  return secrets.token_urlsafe(32)


def bearer_token(headers: Mapping[str, str]) -> str | None:
  """The token of an `Authorization: Bearer TOKEN` header, if there is one."""
  auth = headers.get("Authorization", "")
  return auth[7:].strip() if auth[:7].lower() == "bearer " else None


def admin_status(headers: Mapping[str, str], token: str) -> int | None:
  """None when `headers` carry the admin token; else the HTTP status to refuse with: 401 without a
  bearer token, 403 with another one (a rollout's key, a guess)."""
  given = bearer_token(headers)
  if not given:
    return 401
  return None if hmac.compare_digest(given.encode(), token.encode()) else 403


def server_admin_token(token_file: str | os.PathLike[str]) -> tuple[str, str]:
  """(token, where it came from) for a server: $CLAWJAX_ADMIN_TOKEN, or a new token written to
  `token_file` (created mode 0600, or made 0600 if it exists)."""
  token = os.environ.get(ADMIN_TOKEN_ENV)
  if token:
    return token, f"${ADMIN_TOKEN_ENV}"
  token = new_token()
  os.makedirs(os.path.dirname(os.path.abspath(token_file)), exist_ok=True)
  fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  try:
    os.fchmod(fd, 0o600)
    os.write(fd, token.encode() + b"\n")
  finally:
    os.close(fd)
  return token, os.fspath(token_file)


def client_admin_token(token_file: str | os.PathLike[str] | None) -> str | None:
  """The token a client sends: $CLAWJAX_ADMIN_TOKEN, else the first line of `token_file` (None: none)."""
  token = os.environ.get(ADMIN_TOKEN_ENV)
  if token or token_file is None:
    return token or None
  with open(token_file, encoding="utf-8") as f:
    return f.readline().strip() or None
