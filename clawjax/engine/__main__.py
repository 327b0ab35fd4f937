"""`python -m clawjax.engine --model PRESET_OR_DIR --port P`: the engine behind SGLang's native protocol.

/update_weights_from_disk and /flush_cache need the admin token as `Authorization: Bearer TOKEN`:
$CLAWJAX_ADMIN_TOKEN when set, otherwise a fresh one written (mode 0600) to --admin-token-file, by
default $CLAWJAX_CACHE/engine/admin_token.PORT (~/.cache/clawjax/...).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging

from aiohttp import web

from clawjax import paths
from clawjax.auth import ADMIN_TOKEN_ENV, server_admin_token
from clawjax.config import parse_value
from clawjax.engine.engine import Engine, EngineConfig
from clawjax.engine.server import EngineServer
from clawjax.models.loading import load_model, load_weights


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m clawjax.engine", description=__doc__)
  parser.add_argument("--model", required=True, help="preset (test-tiny, smollm2-135m, ...) or HF safetensors dir")
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, default=30000, help="default: SGLang's default port")
  parser.add_argument("--init-seed", type=int, default=0, help="init seed of random presets")
  parser.add_argument("--admin-token-file", default=None,
                      help=f"where a generated admin token is written (mode 0600) when ${ADMIN_TOKEN_ENV} is "
                           "unset; default: $CLAWJAX_CACHE/engine/admin_token.PORT")
  for f in dataclasses.fields(EngineConfig):
    if isinstance(f.default, bool):  # `--flag`, `--flag true|false`
      parser.add_argument(f"--{f.name.replace('_', '-')}", type=lambda text, name=f.name: parse_value(bool, text, name),
                          nargs="?", const=True, default=f.default, help=f"EngineConfig.{f.name} (default {f.default})")
    else:
      parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                          help=f"EngineConfig.{f.name} (default {f.default})")
  parser.add_argument("--enable-return-routed-experts", dest="record_routes", action="store_true",
                      help="SGLang's name of --record-routes: answer return_routed_experts")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  token, source = server_admin_token(args.admin_token_file
                                     or paths.cache_dir("engine") / f"admin_token.{args.port}")
  logging.info("admin token (weight update, cache flush) from %s", source)
  loaded = load_model(args.model, seed=args.init_seed)
  config = EngineConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})
  engine = Engine(loaded.model, config)
  server = EngineServer(engine, loaded.path,
                        lambda path, version: engine.update_from_model(load_weights(path, loaded.model), version),
                        eos_token_id=loaded.eos_token_id, decode=loaded.decode, admin_token=token)
  try:
    web.run_app(server.app, host=args.host, port=args.port, print=lambda msg: logging.info("%s", msg))
  finally:
    engine.close()


if __name__ == "__main__":
  main()
