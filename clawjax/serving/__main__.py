"""`python -m clawjax.serving --backend NAME --model PATH_OR_PRESET --log-dir DIR [...]`: run the shim.

The control routes (POST /rollouts, POST /rollouts/ID/finish, GET /rollouts/ID) need the admin token as
`Authorization: Bearer TOKEN`: $CLAWJAX_ADMIN_TOKEN when set, otherwise a fresh one written (mode 0600)
to --admin-token-file, by default LOG_DIR/admin_token, where the trainer reads it. Harnesses get only
their rollout's key.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import signal
from typing import Any

from clawjax.auth import ADMIN_TOKEN_ENV, server_admin_token
from clawjax.models.vocab import text_source
from clawjax.serving.backends.base import backend_names, create_backend
from clawjax.serving.profiles import load_profiles
from clawjax.serving.server import ShimConfig, ShimServer
from clawjax.text.templates import load_template


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
  p.add_argument("--gc-threshold", type=int, default=50_000,
                 help="allocations between young-generation garbage collections (Python's default "
                      "is 700). Each call allocates a few thousand objects (parsed request, token "
                      "lists), so at the default the collector runs several times per call and "
                      "rescans every live rollout's state: 2-10 ms per call at 16 rollouts. 0 keeps "
                      "Python's settings")
  p.add_argument("--event-loop", choices=("uvloop", "asyncio"), default="uvloop",
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
  for field, kind in [("max_new_tokens", int), ("max_context", int), ("top_k", int),
                      ("max_body_bytes", int), ("log_threads", int), ("temperature", float),
                      ("top_p", float), ("keepalive_s", float), ("finish_timeout_s", float),
                      ("read_timeout_s", float), ("max_connections_per_client", int),
                      ("max_json_depth", int), ("min_free_log_bytes", int)]:
    p.add_argument("--" + field.replace("_", "-"), type=kind, default=getattr(defaults, field),
                   help=f"ShimConfig.{field} (documented in clawjax/serving/server.py)")
  return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
  template = load_template(text_source(args.model), args.template_family)
  options = dict(args.backend_arg)
  if args.backend == "scripted":
    options["template"] = template  # The script is rendered with the very template the shim uses.
  backend = create_backend(args.backend, url=args.backend_url, model=args.model, **options)
  fields = {f.name for f in dataclasses.fields(ShimConfig)}
  config = ShimConfig(**{k: v for k, v in vars(args).items() if k in fields})
  token, token_source = server_admin_token(args.admin_token_file
                                           or os.path.join(args.log_dir, "admin_token"))
  server = ShimServer(config, backend, template,
                      load_profiles(args.profiles) if args.profiles else None, token)
  url = await server.start()
  if args.gc_threshold:
    # What exists now (modules, tokenizer, template caches) lives as long as the process: keep it out
    # of every future collection, then collect young objects less often.
    gc.freeze()
    gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
  logging.info("clawjax shim (%s backend) serving at %s, logs in %s, admin token from %s", args.backend,
               url, args.log_dir, token_source)
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for sig in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(sig, stop.set)
  await stop.wait()
  await server.stop()


def main(argv: list[str] | None = None) -> None:
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  args = parse_args(argv)
  if args.event_loop == "uvloop":
    import uvloop  # pylint: disable=g-import-not-at-top  (optional: not on Windows)
    uvloop.run(serve(args))
  else:
    asyncio.run(serve(args))


if __name__ == "__main__":
  main()
