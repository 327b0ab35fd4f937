"""`python -m clawjax.harness.mini --base-url URL --api-key KEY --task TEXT --workspace DIR`.

Prints one JSON line (status, final answer, turns, calls) on stdout; exit 0 on a final answer, 3 when
max turns ran out, 1 on an API error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from clawjax.harness.mini.agent import HarnessError, MiniAgent, MiniConfig


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m clawjax.harness.mini", description=__doc__)
  parser.add_argument("--base-url", required=True, help="API root; /v1/chat/completions is appended")
  parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""))
  parser.add_argument("--task", required=True)
  parser.add_argument("--workspace", default=".")
  parser.add_argument("--transcript", default=None,
                      help="transcript JSONL (default: $HOME/.mini/transcript.jsonl)")
  for f in dataclasses.fields(MiniConfig):
    parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
  args = parser.parse_args(argv)
  config = MiniConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(MiniConfig)})
  transcript = pathlib.Path(args.transcript or pathlib.Path.home() / ".mini" / "transcript.jsonl")
  transcript.parent.mkdir(parents=True, exist_ok=True)
  with open(transcript, "a") as fh:
    agent = MiniAgent(args.base_url, args.api_key, pathlib.Path(args.workspace).resolve(), config, fh)
    try:
      result = agent.run(args.task)
    except HarnessError as e:
      result = {"status": "error", "error": str(e), "calls": agent.calls}
  print(json.dumps(result))
  return {"done": 0, "max_turns": 3}.get(result["status"], 1)


if __name__ == "__main__":
  sys.exit(main())
