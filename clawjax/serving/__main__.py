"""`python -m clawjax.serving --backend NAME --model PATH_OR_PRESET --log-dir DIR [...]`: run the shim.

The control routes (POST /rollouts, POST /rollouts/ID/finish, GET /rollouts/ID) need the admin token as
`Authorization: Bearer TOKEN`: $CLAWJAX_ADMIN_TOKEN when set, otherwise a fresh one written (mode 0600)
to --admin-token-file, by default LOG_DIR/admin_token, where the trainer reads it. Harnesses get only
their rollout's key.

With --workers N > 1 this process is the front: it answers the control routes on --port and runs N
worker processes, each serving the model calls of the rollouts pinned to it on a port of its own (the
base_url POST /rollouts answers names it; GET /health lists them). See clawjax/serving/front.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Any

from clawjax.auth import ADMIN_TOKEN_ENV, server_admin_token
from clawjax.config import ConfigError
from clawjax.serving.backends.base import backend_names
from clawjax.serving.front import ShimFront
from clawjax.serving.server import ShimConfig, ShimServer
from clawjax.serving.workers import EVENT_LOOPS, LOG_FORMAT, WorkerSpec, run_event_loop, tune_gc, until_stopped


def _backend_arg(item: str) -> tuple[str, Any]:
  """KEY=VALUE; VALUE is a JSON scalar when it parses as one (8, 0.5, true), else the string."""
  key, sep, value = item.partition("=")
  if not sep or not key:
    raise argparse.ArgumentTypeError(f"--backend-arg {item!r}: expected KEY=VALUE")
  try:
    parsed = json.loads(value)
  except ValueError:
    return key, value
  return key, parsed if isinstance(parsed, (int, float, bool)) else value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  defaults = ShimConfig(log_dir="")
  spec_defaults = WorkerSpec("scripted", "")
  p = argparse.ArgumentParser(prog="python -m clawjax.serving", description=__doc__,
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--backend", required=True, choices=backend_names())
  p.add_argument("--backend-url", default=None, help="engine root URL (sglang, vllm)")
  p.add_argument("--backend-arg", type=_backend_arg, action="append", default=[],
                 help="KEY=VALUE passed to the backend factory, e.g. script=turns.json, "
                      "failures=2:500, served_model=NAME, timeout_s=600")
  p.add_argument("--model", required=True, help="tokenizer (qwen3, smollm2), model preset (test-tiny, "
                 "smollm2-135m, ...) or HF model dir: picks the tokenizer and chat template")
  p.add_argument("--template-family", default=None, choices=("qwen3", "chatml"),
                 help="override the chat family guessed from --model")
  p.add_argument("--model-name", default=defaults.model_name, help="name reported to clients")
  p.add_argument("--host", default=defaults.host)
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--public-url", default=None, help="root URL clients use, if not http://HOST:PORT")
  p.add_argument("--log-dir", required=True)
  p.add_argument("--admin-token-file", default=None,
                 help=f"where a generated admin token is written (mode 0600) when ${ADMIN_TOKEN_ENV} is "
                      "unset; default: LOG_DIR/admin_token")
  p.add_argument("--profiles", default=None, help="JSON file of harness role profiles")
  p.add_argument("--gc-threshold", type=int, default=spec_defaults.gc_threshold,
                 help="allocations between young-generation garbage collections (Python's default "
                      "is 700). Each call allocates a few thousand objects (parsed request, token "
                      "lists), so at the default the collector runs several times per call and "
                      "rescans every live rollout's state: 2-10 ms per call at 16 rollouts. 0 keeps "
                      "Python's settings")
  p.add_argument("--event-loop", choices=EVENT_LOOPS, default=spec_defaults.event_loop,
                 help="uvloop (libuv) halves the event loop's own cost per request against asyncio's "
                      "default loop; asyncio is the fallback where uvloop does not install (Windows)")
  p.add_argument("--incremental-stream", action=argparse.BooleanOptionalAction,
                 default=defaults.incremental_stream,
                 help="stream text as the engine samples it; off sends "
                      "each turn whole once generated, which costs the shim less per call "
                      "(ShimConfig.incremental_stream)")
  p.add_argument("--fsync-call-log", action=argparse.BooleanOptionalAction,
                 default=defaults.fsync_call_log,
                 help="fsync each call record before the response's final bytes (ShimConfig.fsync_call_log)")
  p.add_argument("--workers", type=int, default=defaults.workers,
                 help="shim processes: N > 1 runs a front (the control routes, on --port) and N worker "
                      "processes serving the model calls, each rollout pinned to one "
                      "(ShimConfig.workers); not with --backend embedded")
  for field, kind in [("worker_start_timeout_s", float), ("max_new_tokens", int), ("max_context", int), ("top_k", int),
                      ("max_body_bytes", int), ("log_threads", int), ("temperature", float),
                      ("top_p", float), ("keepalive_s", float), ("finish_timeout_s", float),
                      ("read_timeout_s", float), ("max_connections_per_client", int),
                      ("max_json_depth", int), ("min_free_log_bytes", int)]:
    p.add_argument("--" + field.replace("_", "-"), type=kind, default=getattr(defaults, field),
                   help=f"ShimConfig.{field} (documented in clawjax/serving/server.py)")
  return p.parse_args(argv)


async def serve(args: argparse.Namespace, config: ShimConfig, spec: WorkerSpec) -> None:
  token, token_source = server_admin_token(args.admin_token_file
                                           or os.path.join(args.log_dir, "admin_token"))
  if config.workers == 1:
    backend, template, profiles = spec.build()
    server = ShimServer(config, backend, template, profiles, token)
  else:
    server = ShimFront(config, spec, token)
  url = await server.start()
  tune_gc(spec.gc_threshold)
  logging.info("clawjax shim (%s backend, %d process%s) serving at %s, logs in %s, admin token from %s",
               args.backend, config.workers, "es" if config.workers > 1 else "", url, args.log_dir,
               token_source)
  await until_stopped()
  await server.stop()


def main(argv: list[str] | None = None) -> None:
  logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
  args = parse_args(argv)
  fields = {f.name for f in dataclasses.fields(ShimConfig)}
  try:
    config = ShimConfig(**{k: v for k, v in vars(args).items() if k in fields})
    spec = WorkerSpec(args.backend, args.model, args.backend_url, dict(args.backend_arg),
                      template_family=args.template_family, profiles=args.profiles,
                      gc_threshold=args.gc_threshold, event_loop=args.event_loop)
    spec.check_workers(config.workers)
  except (ConfigError, ValueError) as e:
    sys.exit(f"python -m clawjax.serving: {e}")
  run_event_loop(serve(args, config, spec), args.event_loop)


if __name__ == "__main__":
  main()
