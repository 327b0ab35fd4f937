"""What a shim process builds for itself (`WorkerSpec`), how it runs, and the worker processes of a shim
with `ShimConfig.workers` > 1.

`python -m clawjax.serving` builds its backend, chat template and harness profiles from a `WorkerSpec`;
with several workers each worker process builds its own from the same spec (an engine object cannot
cross processes; its address can). A worker is `python -m clawjax.serving.workers`, started by the front
(`clawjax.serving.front`), which binds the worker's listening socket and hands it over as an inherited
file descriptor, with one JSON line on stdin: {"index", "spec", "config" (the worker's ShimConfig),
"fd", "admin_token", "lost" (rollout id -> why: the rollouts of a worker this one replaces)}. The worker serves
a `ShimServer` on the socket, writes `ready` on stdout, and stops, letting its calls in flight be logged
and answered, on SIGTERM or SIGINT or when its stdin closes (the front is gone).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine, Mapping
from typing import Any

from clawjax.config import ConfigError
from clawjax.models.vocab import text_source
from clawjax.serving.backends.base import Backend, backend_names, create_backend
from clawjax.serving.profiles import HarnessProfile, load_profiles
from clawjax.serving.server import ShimConfig, ShimServer
from clawjax.text.templates import ChatTemplate, load_template

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
EVENT_LOOPS = ("uvloop", "asyncio")


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
  """The backend, chat template and harness profiles a shim process builds, and how it runs."""
  backend: str  # A registered backend name (clawjax.serving.backends).
  model: str  # The backend's model= and, unless `template` is set, the tokenizer + chat template source.
  backend_url: str | None = None  # Engine root URL (sglang, vllm).
  # The backend factory's other keyword arguments: JSON values (they cross to worker processes as JSON).
  backend_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  template: str | None = None  # Tokenizer + chat template source when not `model` (a preset, a dir).
  template_family: str | None = None  # "qwen3" | "chatml"; None: guessed from the source.
  profiles: str | None = None  # JSON file of harness role profiles (clawjax.serving.profiles).
  # Allocations between young-generation garbage collections, after everything loaded at start-up is
  # frozen out of collection (0: Python's settings). See `python -m clawjax.serving --help`.
  gc_threshold: int = 50_000
  event_loop: str = "uvloop"  # "uvloop" (libuv: half asyncio's loop cost per request) | "asyncio".

  def __post_init__(self):
    if self.backend not in backend_names():
      raise ValueError(f"WorkerSpec.backend: {self.backend!r} is not one of {backend_names()}")
    if self.event_loop not in EVENT_LOOPS:
      raise ValueError(f"WorkerSpec.event_loop: {self.event_loop!r} is not one of {EVENT_LOOPS}")
    try:
      json.dumps(dict(self.backend_options), allow_nan=False)
    except (TypeError, ValueError) as e:
      raise ValueError(f"WorkerSpec.backend_options: not JSON values ({e})") from None

  def check_workers(self, workers: int) -> None:
    """ConfigError unless every one of `workers` shim processes can build this backend on its own."""
    if workers > 1 and self.backend == "embedded":
      raise ConfigError(f"shim.workers={workers} with the embedded backend: each worker process would load an "
                        "engine of its own; run one shim process (workers=1), or serve the model once with "
                        "`python -m clawjax.engine` and give the workers the sglang backend at its URL")

  def to_json(self) -> dict[str, Any]:
    return dict(dataclasses.asdict(self), backend_options=dict(self.backend_options))

  def build(self) -> tuple[Backend, ChatTemplate, dict[str, HarnessProfile] | None]:
    template = load_template(text_source(self.template or self.model), self.template_family)
    options = dict(self.backend_options)
    if self.backend == "scripted":
      options["template"] = template  # The script is rendered with the very template the shim uses.
    backend = create_backend(self.backend, url=self.backend_url, model=self.model, **options)
    return backend, template, load_profiles(self.profiles) if self.profiles else None


def tune_gc(threshold: int) -> None:
  """What exists now (modules, tokenizer, template caches) lives as long as the process: keeps it out of
  every future collection, then collects young objects every `threshold` allocations (0: unchanged)."""
  if threshold:
    gc.freeze()
    gc.set_threshold(threshold, *gc.get_threshold()[1:])


def run_event_loop(main: Coroutine[Any, Any, None], event_loop: str) -> None:
  if event_loop == "uvloop":
    import uvloop  # pylint: disable=g-import-not-at-top  (optional: not on Windows)
    uvloop.run(main)
  else:
    asyncio.run(main)


async def until_stopped(watch_stdin: bool = False) -> None:
  """Returns on SIGINT or SIGTERM, or (`watch_stdin`) when stdin reaches its end."""
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(sig, stop.set)
  if watch_stdin:
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    asyncio.ensure_future(stdin.read()).add_done_callback(lambda _: stop.set())
  await stop.wait()


async def _serve(order: dict[str, Any]) -> None:
  spec = WorkerSpec(**order["spec"])
  backend, template, profiles = spec.build()
  server = ShimServer(ShimConfig(**order["config"]), backend, template, profiles, order["admin_token"])
  server.registry.lost.update(order["lost"])
  await server.start(socket.socket(fileno=order["fd"]))
  tune_gc(spec.gc_threshold)
  sys.stdout.write("ready\n")
  sys.stdout.flush()
  os.dup2(2, 1)  # Anything printed later goes to the log, not into a pipe nobody reads.
  await until_stopped(watch_stdin=True)
  await server.stop()


def main() -> None:
  order = json.loads(sys.stdin.buffer.readline())
  logging.basicConfig(level=logging.INFO, format=LOG_FORMAT.replace("%(name)s", f"worker {order['index']} %(name)s"))
  run_event_loop(_serve(order), order["spec"]["event_loop"])


if __name__ == "__main__":
  main()
