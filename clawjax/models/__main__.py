"""`python -m clawjax.models export --checkpoint RUN/checkpoints/N --out DIR [--config RUN/config.json]`:
a training checkpoint's policy as a Hugging Face safetensors directory (clawjax/models/export.py)."""

from __future__ import annotations

import argparse
import sys

from clawjax.models.export import export


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m clawjax.models")
  sub = parser.add_subparsers(dest="command", required=True)
  e = sub.add_parser("export", help="a training checkpoint's policy as an HF safetensors directory")
  e.add_argument("--checkpoint", required=True, help="a checkpoint step directory, RUN/checkpoints/N")
  e.add_argument("--out", required=True, help="the directory to write (config, tokenizer files, weights)")
  e.add_argument("--config", default=None, help="the run's config.json (default: RUN/config.json)")
  args = parser.parse_args(argv)
  try:
    print(export(args.checkpoint, args.out, args.config))
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
