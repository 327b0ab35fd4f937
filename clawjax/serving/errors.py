"""Errors the shim answers with, independent of the API dialect that shapes them."""

from __future__ import annotations

import dataclasses

# Dialect-neutral error kinds; each dialect maps a kind to its own error type/code names.
INVALID = "invalid_request"
AUTH = "authentication"
PERMISSION = "permission"  # An admin route with a token that is not the admin token.
NOT_FOUND = "not_found"
NOT_ALLOWED = "method_not_allowed"
TIMEOUT = "request_timeout"  # The request did not arrive in time.
TOO_LARGE = "request_too_large"
CONTEXT = "context_length_exceeded"
OVERLOADED = "overloaded"
UNAVAILABLE = "unavailable"  # The shim cannot take work now (its call log is low on space); retryable.
INTERNAL = "internal"

_STATUS = {INVALID: 400, AUTH: 401, PERMISSION: 403, NOT_FOUND: 404, NOT_ALLOWED: 405, TIMEOUT: 408,
           TOO_LARGE: 413, CONTEXT: 400, OVERLOADED: 529, UNAVAILABLE: 503, INTERNAL: 500}


@dataclasses.dataclass
class ApiError(Exception):
  """An error answered to the client. `param` names the offending request field (e.g. messages.2.role)."""
  kind: str
  message: str
  status: int = 0
  param: str | None = None

  def __post_init__(self):
    if not self.status:
      self.status = _STATUS[self.kind]
    super().__init__(self.message)


def invalid(param: str, message: str) -> ApiError:
  return ApiError(INVALID, f"{param}: {message}", param=param)
