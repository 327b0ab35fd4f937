"""`python -m clawjax.tree summarize CALLS.jsonl [--max-leaves N]`: one JSON summary per rollout.

Roles inferred for role=null calls are reported on stderr, so stdout stays one object per rollout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from clawjax import calllog
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.summary import summarize


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m clawjax.tree")
  sub = parser.add_subparsers(dest="command", required=True)
  s = sub.add_parser("summarize", help="build, filter and summarise each rollout of a call log")
  s.add_argument("paths", nargs="+", help="call-log JSONL files or directories of them")
  s.add_argument("--max-leaves", type=int, default=FilterConfig.max_leaves,
                 help="over-branching limit (default %(default)s)")
  s.add_argument("--collect-errors", action="store_true",
                 help="report malformed lines on stderr and summarise the rest, instead of stopping")
  args = parser.parse_args(argv)
  config = dataclasses.replace(FilterConfig(), max_leaves=args.max_leaves)
  try:
    log = calllog.load(args.paths, errors="collect" if args.collect_errors else "raise")
  except (calllog.CallLogError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for problem in log.problems:
    print(f"skipped: {problem}", file=sys.stderr)
  for rid in sorted(log.calls):
    f = filter_rollout(rid, log.calls[rid], config)
    if f.inferred:
      print(f"{rid}: role inferred for role=null calls: {json.dumps(f.inferred)}", file=sys.stderr)
    print(json.dumps(summarize(f)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
