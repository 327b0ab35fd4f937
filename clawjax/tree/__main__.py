"""`python -m clawjax.tree summarize CALLS.jsonl [--max-leaves N]`: one JSON summary per rollout.
`python -m clawjax.tree view CALLS.jsonl [--rollout ID] [--workdir RUN] [--tokenizer T] --out tree.html`:
the rollout-tree viewer (clawjax/tree/view.py), one self-contained HTML page.

Roles inferred for role=null calls are reported on stderr, so stdout stays one object per rollout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

from clawjax import calllog
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.summary import summarize
from clawjax.tree.view import Pieces, load_views, token_pieces, viewer_html


def _tokenizer_pieces(path: str) -> Pieces:
  """Per-token text from a tokenizer.json (or a model directory holding one)."""
  import tokenizers  # pylint: disable=import-outside-toplevel  (only for a decoded view)
  file = pathlib.Path(path)
  file = file / "tokenizer.json" if file.is_dir() else file
  try:
    tok = tokenizers.Tokenizer.from_file(str(file))
  except Exception as e:  # tokenizers raises a bare Exception on a missing or malformed file
    raise ValueError(f"--tokenizer {path}: cannot read {file}: {e}") from None
  return token_pieces(tok)


def _summarize(args: argparse.Namespace, config: FilterConfig) -> int:
  log = calllog.load(args.paths, errors="collect" if args.collect_errors else "raise")
  for problem in log.problems:
    print(f"skipped: {problem}", file=sys.stderr)
  for rid in sorted(log.calls):
    f = filter_rollout(rid, log.calls[rid], config)
    if f.inferred:
      print(f"{rid}: role inferred for role=null calls: {json.dumps(f.inferred)}", file=sys.stderr)
    print(json.dumps(summarize(f)))
  return 0


def _view(args: argparse.Namespace, config: FilterConfig) -> int:
  pieces = _tokenizer_pieces(args.tokenizer) if args.tokenizer else None
  views = load_views(args.paths, workdir=args.workdir, rollout_ids=args.rollout, pieces=pieces, config=config,
                     errors="collect" if args.collect_errors else "raise")
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(viewer_html(views, title=args.title or ", ".join(map(str, args.paths))), encoding="utf-8")
  print(f"{out}: {len(views)} rollouts")
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m clawjax.tree")
  sub = parser.add_subparsers(dest="command", required=True)
  s = sub.add_parser("summarize", help="build, filter and summarise each rollout of a call log")
  v = sub.add_parser("view", help="write the rollout-tree viewer (one self-contained HTML page)")
  for p in (s, v):
    p.add_argument("paths", nargs="+", help="call-log JSONL files or directories of them")
    p.add_argument("--max-leaves", type=int, default=FilterConfig.max_leaves,
                   help="over-branching limit (default %(default)s)")
    p.add_argument("--collect-errors", action="store_true",
                   help="report malformed lines on stderr and use the rest, instead of stopping")
  v.add_argument("--rollout", action="append", default=[], help="only this rollout id (repeatable)")
  v.add_argument("--workdir", default=None,
                 help="the run directory: its call logs, rollout records and step advantages")
  v.add_argument("--tokenizer", default=None,
                 help="a tokenizer.json or a model directory with one: tokens shown as text (else ids)")
  v.add_argument("--title", default=None, help="page title (default: the paths)")
  v.add_argument("--out", required=True, help="the HTML file to write")
  args = parser.parse_args(argv)
  config = dataclasses.replace(FilterConfig(), max_leaves=args.max_leaves)
  try:
    return _summarize(args, config) if args.command == "summarize" else _view(args, config)
  except (calllog.CallLogError, OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())
