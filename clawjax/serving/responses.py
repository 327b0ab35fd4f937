"""How the shim's HTTP servers answer: JSON bodies, every error in its API dialect's shape, and the checks
of the control routes (the admin token, the body of `POST /rollouts`). Shared by the shim
(`server.ShimServer`) and the front of a shim with several worker processes (`front.ShimFront`), so both
refuse and shape alike.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from clawjax.auth import admin_status
from clawjax.serving import errors
from clawjax.serving.chat import Dialect, dumps
from clawjax.serving.errors import ApiError
from clawjax.serving.intake import read_json

log = logging.getLogger(__name__)


def json_response(body: Any, status: int = 200) -> web.Response:
  return web.Response(body=dumps(body).encode(), status=status, content_type="application/json")


def error_response(dialect: Dialect, err: ApiError) -> web.Response:
  return json_response(dialect.error_body(err), err.status)


def _http_error(e: web.HTTPException, request: web.Request) -> ApiError:
  """aiohttp's own error (an unknown route, a method the route lacks) as one the dialects shape."""
  kinds = {404: errors.NOT_FOUND, 405: errors.NOT_ALLOWED, 408: errors.TIMEOUT, 413: errors.TOO_LARGE}
  return ApiError(kinds.get(e.status, errors.INVALID if e.status < 500 else errors.INTERNAL),
                  f"{request.method} {request.path}: {e.reason}", status=e.status)


def error_middleware(anthropic: Dialect, openai: Dialect):
  """The aiohttp middleware that answers every error a route raises as the dialect's error body: a
  model call's own (Anthropic's by its path or its `anthropic-version` header), OpenAI's otherwise."""

  @web.middleware
  async def shape_errors(request: web.Request, handler) -> web.StreamResponse:
    dialect = anthropic if ("/v1/messages" in request.path
                            or "anthropic-version" in request.headers) else openai
    try:
      return await handler(request)
    except ApiError as e:
      return error_response(dialect, e)
    except web.HTTPException as e:
      if e.status < 400:
        raise
      return error_response(dialect, _http_error(e, request))
    except HttpProcessingError as e:  # A body aiohttp could not decode (bad chunked encoding).
      return error_response(dialect, ApiError(errors.INVALID, f"malformed request: {e.message}"))
    except ConnectionError:
      raise  # The client went: nobody to answer (aiohttp drops the connection quietly).
    except Exception:  # pylint: disable=broad-except
      log.exception("%s %s failed", request.method, request.path)
      return error_response(dialect, ApiError(errors.INTERNAL, "internal error of the shim (logged)"))

  return shape_errors


def require_admin(request: web.Request, token: str) -> None:
  """A control route's check: ApiError 401 without a bearer token, 403 with any but the admin token."""
  status = admin_status(request.headers, token)
  if status == 401:
    raise ApiError(errors.AUTH, "control route: send the admin token as Authorization: Bearer TOKEN")
  if status == 403:
    raise ApiError(errors.PERMISSION, "control route: that is not the admin token")


def _rollout_fields(body: Any) -> dict[str, str | None]:
  """The fields of a `POST /rollouts` body: task_id and harness (strings), rollout_id (a string or
  absent); ApiError 400 naming the field otherwise."""
  if not isinstance(body, dict):
    raise ApiError(errors.INVALID, "body must be a JSON object")
  fields = {k: body.get(k) for k in ("task_id", "harness", "rollout_id")}
  for k, val in fields.items():
    if (val is not None or k != "rollout_id") and not isinstance(val, str):
      raise errors.invalid(k, "must be a string")
  return fields


def add_control_routes(app: web.Application, server: Any) -> None:
  """The control routes, behind the admin token, over `server`'s in-process forms of them:
    POST /rollouts {task_id, harness[, rollout_id]}  `create_rollout(task_id, harness, rollout_id)` (a
        ValueError, for a bad or taken id, answers 400)
    POST /rollouts/{rid}/finish                      `finish_rollout(rid)` (None: 404)
    GET  /rollouts/{rid}                             `rollout_summary(rid)` (None: 404)
  `server` also has `admin_token` and `config` (a ShimConfig: the body's limits)."""

  async def create(request: web.Request) -> web.Response:
    require_admin(request, server.admin_token)
    config = server.config
    fields = _rollout_fields(await read_json(request, config.max_body_bytes, config.read_timeout_s,
                                             config.max_json_depth))
    try:
      return json_response(await server.create_rollout(**fields))
    except ValueError as e:
      raise ApiError(errors.INVALID, str(e)) from None

  def summary_route(answer):
    async def route(request: web.Request) -> web.Response:
      require_admin(request, server.admin_token)
      summary = await answer(request.match_info["rid"])
      if summary is None:
        raise ApiError(errors.NOT_FOUND, "unknown rollout")
      return json_response(summary)
    return route

  app.router.add_post("/rollouts", create)
  app.router.add_post("/rollouts/{rid}/finish", summary_route(server.finish_rollout))
  app.router.add_get("/rollouts/{rid}", summary_route(server.rollout_summary))
