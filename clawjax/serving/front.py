"""The front of a shim with several worker processes (`ShimConfig.workers` = N), and `ShimProcessPool`,
which runs it in-process as `ShimThread` runs one `ShimServer`.

One shim process runs out of event loop at ~100 concurrent rollouts (a call costs it ~5 ms of CPU). With
N workers, the front binds N listening sockets on `config.host` (free ports), starts N worker processes
(`python -m clawjax.serving.workers`), each a whole `ShimServer` serving on its socket, and answers the
control routes itself:
  POST /rollouts    pins the rollout to the running worker with the fewest live rollouts (ties taken in
                    turn) and forwards the request to it over loopback HTTP: the answer's base_url is
                    that worker's own port, so the rollout's model calls go to its worker directly, never
                    through the front (a sandbox relays that port: it is the port of its base_url).
  POST /rollouts/{id}/finish, GET /rollouts/{id}
                    forwarded to the rollout's worker (a finish waits there for its calls in flight).
  GET /health       every worker's health (`workers`); 200 when all are up.
The front checks the admin token before it forwards anything; the workers check it again (the front
sends it) and write their rollouts' call logs into the one log_dir, a file per rollout, as one shim does.
The front serves no model route: 404 in the API's shape.

A worker that dies (kill -9, out of memory): the front holds its listening socket, so connections wait
in the socket's backlog instead of being refused, and starts a new worker on it, told which rollouts were
live on the dead one. Their calls then get 401 in the API's shape saying the rollout is lost; finishing or
inspecting one answers its summary read back from its call log, `failed` saying why (every call the dead
worker answered is in that log: it wrote each before answering). A worker that cannot be started again
leaves its port closed and gets no new rollouts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import urllib.parse
from typing import Any

import aiohttp
from aiohttp import web

import clawjax
from clawjax.auth import new_token
from clawjax.serving import errors
from clawjax.serving.anthropic_api import AnthropicDialect
from clawjax.serving.errors import ApiError
from clawjax.serving.intake import ClientCappedSite
from clawjax.serving.logspace import LogSpace
from clawjax.serving.openai_api import OpenAIDialect
from clawjax.serving.responses import add_control_routes, error_middleware, json_response
from clawjax.serving.rollouts import summary_from_log
from clawjax.serving.server import MODEL_ROUTES, ServerThread, ShimConfig
from clawjax.serving.workers import WorkerSpec

log = logging.getLogger(__name__)

# A forwarded request that fails: how long its worker may take to be seen exiting before the failure is
# the worker's (an error answered) rather than its death (the summary read back from the log).
_DEATH_GRACE_S = 5.0
# A stopping worker gets finish_timeout_s for its calls in flight, then this long for the rest of its
# shutdown, before it is killed.
_STOP_GRACE_S = 10.0
_LISTEN_BACKLOG = 1024  # Connections a worker's socket holds while no process accepts on it.


def _url(host: str, port: int, scheme: str = "http") -> str:
  return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _exit_status(returncode: int) -> str:
  if returncode < 0:
    return f"killed by {signal.Signals(-returncode).name}"
  return f"exit status {returncode}"


@dataclasses.dataclass(eq=False)
class _Worker:
  """One worker slot: its socket outlives the processes that serve it."""
  index: int
  sock: socket.socket
  url: str  # Where its rollouts' clients reach it (their base_url's root).
  local_url: str  # Where the front reaches it.
  proc: asyncio.subprocess.Process | None = None
  incarnation: int = 0  # Processes that came up on this slot so far.
  up: bool = False  # A process serves the slot now.
  closed: bool = False  # No process could be started again: the port is closed.
  restarts: int = 0
  creating: int = 0  # POST /rollouts forwarded to it and not answered yet.
  live: set[str] = dataclasses.field(default_factory=set)  # Its unfinished rollouts.
  lost: dict[str, str] = dataclasses.field(default_factory=dict)  # Rollouts lost to deaths: id -> why.
  death: str = ""  # Why its last process ended.


@dataclasses.dataclass(eq=False)
class _Pinned:
  """A rollout and the worker process that has it."""
  worker: _Worker
  incarnation: int
  task_id: str
  harness: str
  log_path: str
  lost: str | None = None  # Why, once its worker died while it was live.


class _Unreachable(Exception):
  pass


def _worker_error(status: int, raw: bytes) -> ApiError:
  """A worker's error answer (OpenAI's shape, as every control route's) as the front's own."""
  try:
    message = json.loads(raw)["error"]["message"]
  except (ValueError, KeyError, TypeError):
    message = raw[:300].decode(errors="replace")
  kind = {400: errors.INVALID, 404: errors.NOT_FOUND, 503: errors.UNAVAILABLE}.get(status, errors.INTERNAL)
  return ApiError(kind, message, status=status)


async def _ready(stdout: asyncio.StreamReader) -> bool:
  """Whether a worker said `ready` (False: its stdout ended first)."""
  while line := await stdout.readline():
    if line == b"ready\n":
      return True
  return False


def _worker_env() -> dict[str, str]:
  """The front's environment, with this clawjax first on the path: the workers run the same code."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(clawjax.__file__)))
  path = os.environ.get("PYTHONPATH")
  return dict(os.environ, PYTHONPATH=root + (os.pathsep + path if path else ""))


class ShimFront:
  """The front and its `config.workers` worker processes, each building its backend and chat template
  from `spec`; `start()`/`stop()` inside a running event loop. The same in-process surface as
  ShimServer: `url`, `admin_token`, `config`, `create_rollout`, `finish_rollout`, `rollout_summary`."""

  def __init__(self, config: ShimConfig, spec: WorkerSpec, admin_token: str | None = None):
    spec.check_workers(config.workers)
    self.config, self.spec = config, spec
    self.admin_token = admin_token or new_token()
    self.url = ""
    self.workers: list[_Worker] = []
    self._pinned: dict[str, _Pinned] = {}
    self._reserved: set[str] = set()  # Ids given to POST /rollouts still being created.
    self._turn = 0  # The worker to try first among the least loaded.
    self._session: aiohttp.ClientSession | None = None
    self._runner: web.AppRunner | None = None
    self._watchers: list[asyncio.Future] = []
    self.app = web.Application(client_max_size=config.max_body_bytes,
                               middlewares=[error_middleware(AnthropicDialect(), OpenAIDialect())])
    add_control_routes(self.app, self)
    self.app.router.add_get("/health", self._health)
    for path in MODEL_ROUTES:
      for prefix in ("", "/r/{rid}"):
        self.app.router.add_route("*", prefix + path, self._not_here)

  async def start(self) -> str:
    """Starts the workers, then serves the control routes; raises OSError naming the call log directory
    when it is not writable, RuntimeError naming a worker that did not start (its log is on stderr)."""
    LogSpace(self.config.log_dir, self.config.min_free_log_bytes).check_writable()
    # A finish waits up to finish_timeout_s on the worker; the rest of any request is loopback.
    self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
        total=self.config.finish_timeout_s + self.config.read_timeout_s))
    try:
      for index in range(self.config.workers):
        self.workers.append(self._bind(index))
      started = await asyncio.gather(*map(self._start_worker, self.workers), return_exceptions=True)
      for failure in started:
        if isinstance(failure, BaseException):
          raise failure
      self._runner = web.AppRunner(self.app, access_log=None, keepalive_timeout=self.config.read_timeout_s)
      await self._runner.setup()
      await ClientCappedSite(self._runner, self.config.host, self.config.port,
                             self.config.max_connections_per_client).start()
    except BaseException:
      await self.stop()
      raise
    self._watchers = [asyncio.ensure_future(self._watch(w)) for w in self.workers]
    self.url = self.config.public_url or _url(self.config.host, self._runner.addresses[0][1])
    return self.url

  def _bind(self, index: int) -> _Worker:
    host = self.config.host
    sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                backlog=_LISTEN_BACKLOG)
    port = sock.getsockname()[1]
    local = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return _Worker(index, sock, self._public_url(port) or _url(host, port), _url(local, port))

  def _public_url(self, port: int) -> str | None:
    """A worker's root for clients when `public_url` is set: its scheme and host, the worker's port."""
    if not self.config.public_url:
      return None
    public = urllib.parse.urlsplit(self.config.public_url)
    return _url(public.hostname, port, public.scheme)

  async def _start_worker(self, worker: _Worker) -> None:
    """Starts a process on the worker's socket and waits until it serves."""
    config = dataclasses.replace(self.config, workers=1, port=0, public_url=self._public_url(
        worker.sock.getsockname()[1]))
    fd = worker.sock.fileno()
    order = {"index": worker.index, "spec": self.spec.to_json(), "config": dataclasses.asdict(config),
             "fd": fd, "admin_token": self.admin_token, "lost": worker.lost}
    # Its own session: a Ctrl-C in the front's terminal reaches the front, which stops the workers
    # (and does not take a worker stopping for a death).
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clawjax.serving.workers", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, pass_fds=(fd,), start_new_session=True, env=_worker_env())
    worker.proc = proc
    proc.stdin.write(json.dumps(order).encode() + b"\n")  # (Its stdin stays open: it ends with the front.)
    timeout = self.config.worker_start_timeout_s
    try:
      ready = await asyncio.wait_for(_ready(proc.stdout), timeout)
    except asyncio.TimeoutError:
      proc.kill()
      await proc.wait()
      raise RuntimeError(f"shim worker {worker.index} (pid {proc.pid}) did not start within {timeout:g} s "
                         "(ShimConfig.worker_start_timeout_s); its log is on the shim's stderr") from None
    if not ready:
      returncode = await proc.wait()
      raise RuntimeError(f"shim worker {worker.index} (pid {proc.pid}) ended ({_exit_status(returncode)}) "
                         "before it served; its log is on the shim's stderr")
    worker.incarnation += 1
    worker.up = True
    log.info("shim worker %d (pid %d) serves at %s", worker.index, proc.pid, worker.url)

  async def _watch(self, worker: _Worker) -> None:
    """Starts a new process on the worker's socket each time its process dies."""
    while True:
      proc = worker.proc
      await proc.wait()
      self._mark_dead(worker, proc)
      try:
        await self._start_worker(worker)
      except (RuntimeError, OSError) as e:
        log.error("%s; its port is closed and it gets no new rollouts", e)
        worker.closed = True
        worker.sock.close()
        return
      worker.restarts += 1

  def _mark_dead(self, worker: _Worker, proc: asyncio.subprocess.Process) -> None:
    """Once per process: its live rollouts are lost."""
    if worker.proc is not proc or not worker.up:
      return
    worker.up = False
    worker.death = (f"shim worker {worker.index} (pid {proc.pid}) died ({_exit_status(proc.returncode)}); the "
                    "calls it answered are in the rollout's call log")
    for rid in worker.live:
      worker.lost[rid] = self._pinned[rid].lost = worker.death
    log.error("%s: %d live rollouts lost; starting a new worker on its port", worker.death, len(worker.live))
    worker.live.clear()

  async def stop(self) -> None:
    """Stops serving, then stops the workers (each lets its calls in flight be logged and answered)."""
    for watcher in self._watchers:
      watcher.cancel()
    if self._runner is not None:
      await self._runner.cleanup()
    procs = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
    for proc in procs:
      proc.terminate()
    if procs:
      await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs],
                         timeout=self.config.finish_timeout_s + _STOP_GRACE_S)
    for proc in procs:
      if proc.returncode is None:
        proc.kill()
        await proc.wait()
    for worker in self.workers:
      worker.sock.close()
      if worker.proc is not None:
        worker.proc.stdin.close()
    if self._session is not None:
      await self._session.close()

  # ---- the control routes' in-process forms

  async def create_rollout(self, task_id: str, harness: str, rollout_id: str | None = None
                           ) -> dict[str, Any]:
    """As ShimServer.create_rollout, on the worker with the fewest live rollouts. Raises ValueError for a
    bad or taken id, ApiError(503) when no worker runs or the call log cannot take records."""
    if rollout_id is not None and (rollout_id in self._pinned or rollout_id in self._reserved):
      raise ValueError(f"rollout_id {rollout_id!r} already exists")
    worker = self._least_loaded()
    incarnation = worker.incarnation
    worker.creating += 1
    if rollout_id is not None:
      self._reserved.add(rollout_id)
    try:
      info = await self._forward(worker, "POST", "/rollouts",
                                 {"task_id": task_id, "harness": harness, "rollout_id": rollout_id})
    except _Unreachable as e:
      raise ApiError(errors.UNAVAILABLE, f"shim worker {worker.index} did not answer ({e}); retry") from None
    except ApiError as e:
      if e.status == 400:
        raise ValueError(e.message) from None
      raise
    finally:
      worker.creating -= 1
      self._reserved.discard(rollout_id)
    rid = info["rollout_id"]
    pinned = self._pinned[rid] = _Pinned(worker, incarnation, task_id, harness, info["log_path"])
    if worker.up and worker.incarnation == incarnation:
      worker.live.add(rid)
    else:  # Its worker died after answering.
      worker.lost[rid] = pinned.lost = worker.death
    return info

  async def finish_rollout(self, rollout_id: str) -> dict[str, Any] | None:
    summary = await self._ask(rollout_id, "POST", f"/rollouts/{rollout_id}/finish")
    pinned = self._pinned.get(rollout_id)
    if pinned is not None:
      pinned.worker.live.discard(rollout_id)
    return summary

  async def rollout_summary(self, rollout_id: str) -> dict[str, Any] | None:
    return await self._ask(rollout_id, "GET", f"/rollouts/{rollout_id}")

  def _least_loaded(self) -> _Worker:
    n = len(self.workers)
    turn = [self.workers[(self._turn + k) % n] for k in range(n)]
    running = [w for w in turn if w.up]
    if not running:
      raise ApiError(errors.UNAVAILABLE, "no shim worker is running now; retry later")
    worker = min(running, key=lambda w: len(w.live) + w.creating)
    self._turn = (worker.index + 1) % n
    return worker

  async def _ask(self, rollout_id: str, method: str, path: str) -> dict[str, Any] | None:
    """A control request about one rollout: its worker's answer while the process that has it runs;
    otherwise its summary read back from its call log (failed when it was lost)."""
    pinned = self._pinned.get(rollout_id)
    if pinned is None:
      return None
    worker = pinned.worker
    serving = lambda: pinned.lost is None and worker.up and worker.incarnation == pinned.incarnation
    if serving():
      try:
        return await self._forward(worker, method, path)
      except _Unreachable as e:
        proc = worker.proc
        try:
          await asyncio.wait_for(asyncio.shield(proc.wait()), _DEATH_GRACE_S)
        except asyncio.TimeoutError:
          raise ApiError(errors.INTERNAL, f"shim worker {worker.index} did not answer {method} {path}: "
                         f"{e}") from None
        self._mark_dead(worker, proc)
      except ApiError:
        if serving():  # (Else a new process on the slot answered: it does not know the rollout.)
          raise
    return summary_from_log(rollout_id, pinned.task_id, pinned.harness, pinned.log_path, pinned.lost)

  async def _forward(self, worker: _Worker, method: str, path: str, body: Any = None) -> Any:
    """The worker's JSON answer; ApiError for its error answers, _Unreachable when it gave none."""
    try:
      async with self._session.request(method, worker.local_url + path, json=body,
                                       headers={"Authorization": f"Bearer {self.admin_token}"}) as resp:
        raw = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
      raise _Unreachable(f"{type(e).__name__}: {e}") from None
    if resp.status != 200:
      raise _worker_error(resp.status, raw)
    return json.loads(raw)

  # ---- routes

  async def _health(self, request: web.Request) -> web.Response:
    workers = await asyncio.gather(*map(self._worker_health, self.workers))
    down = [f"worker {w['index']}: {w['status']}" for w in workers if w["status"] != "ok"]
    return json_response({"status": "; ".join(down) or "ok",
                          "live_rollouts": sum(w["live_rollouts"] for w in workers), "workers": workers},
                         503 if down else 200)

  async def _worker_health(self, worker: _Worker) -> dict[str, Any]:
    out = {"index": worker.index, "url": worker.url, "pid": worker.proc.pid if worker.proc else None,
           "restarts": worker.restarts, "live_rollouts": 0}
    if not worker.up:
      return out | {"status": "down: its port is closed" if worker.closed else "restarting"}
    try:
      async with self._session.get(worker.local_url + "/health",
                                   timeout=aiohttp.ClientTimeout(total=self.config.read_timeout_s)) as resp:
        body = await resp.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
      return out | {"status": f"unreachable ({type(e).__name__}: {e})"}
    return out | {"status": body.get("status"), "live_rollouts": body.get("live_rollouts", 0)}

  async def _not_here(self, request: web.Request) -> web.Response:
    raise ApiError(errors.NOT_FOUND, f"{request.method} {request.path}: this is the front of a shim with "
                   "several workers; a rollout's model calls go to the base_url POST /rollouts answered")


class ShimProcessPool(ServerThread):
  """A `ShimFront` and its worker processes, run for a synchronous caller as `ShimThread` runs one
  ShimServer, with the same surface: `url`, `admin_token`, `run(coro)` (on the front's event loop
  thread), `create_rollout`, `finish_rollout`, `start()`/`stop()`, a context manager.

    spec = WorkerSpec("sglang", "qwen3", backend_url="http://127.0.0.1:30000")
    with ShimProcessPool(ShimConfig(log_dir="calls", workers=4), spec) as shim:
      run_rollout(shim.url, task, "claude_code", RolloutConfig(), admin_token=shim.admin_token)
  """

  def __init__(self, config: ShimConfig, spec: WorkerSpec, admin_token: str | None = None):
    super().__init__(ShimFront(config, spec, admin_token))
