"""Command line for tasks.

  python -m clawjax.tasks score --task TASK --workspace WS [--judge-url URL --judge-model M] [--strict]
  python -m clawjax.tasks workspace --task TASK --root DIR      (prints the new workspace's path)
  python -m clawjax.tasks check PATH                            (loads every task, lists the broken)

TASK is a task directory, a PinchBench .md file, a JSONL file holding one task (or pick one with
--task-id), `FILE.jsonl:LINE`, or one JSONL task object given inline. `score` prints one JSON object:
code_score, metrics, error, and rubric_score / final_score / rubric_notes (final_score is null for a
rubric task scored without a judge).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys

from clawjax.tasks.clawgym_jsonl import parse_jsonl_line
from clawjax.tasks.judge import JudgeConfig
from clawjax.tasks.loader import load_tasks, split_loaded
from clawjax.tasks.records import Task, TaskError
from clawjax.tasks.scoring import ScoringConfig, score
from clawjax.tasks.workspace import make_workspace


def resolve_task(spec: str, task_id: str | None = None) -> Task:
  """One task from a --task argument; raises TaskError."""
  if spec.lstrip().startswith("{"):
    return parse_jsonl_line(spec, "<--task>")
  m = re.fullmatch(r"(.+\.jsonl):(\d+)", spec)
  if m and os.path.isfile(m.group(1)):
    lineno = int(m.group(2))
    with open(m.group(1), encoding="utf-8") as fh:
      for i, line in enumerate(fh, start=1):
        if i == lineno:
          return parse_jsonl_line(line, spec)
    raise TaskError(spec, f"the file has fewer than {lineno} lines")
  items = load_tasks(spec)
  if task_id is not None:
    items = [t for t in items if isinstance(t, TaskError) and t.task_id == task_id
             or isinstance(t, Task) and t.task_id == task_id]
    if not items:
      raise TaskError(spec, f"no task {task_id!r}")
  if len(items) != 1:
    raise TaskError(spec, f"holds {len(items)} tasks; pick one with --task-id or FILE.jsonl:LINE")
  if isinstance(items[0], TaskError):
    raise items[0]
  return items[0]


def _judge_config(args: argparse.Namespace) -> JudgeConfig | None:
  if not args.judge_url:
    return None
  if not args.judge_model:
    raise SystemExit("--judge-model is required with --judge-url")
  return JudgeConfig(url=args.judge_url, model=args.judge_model,
                     api_key=args.judge_key or os.environ.get("CLAWJAX_JUDGE_KEY", ""),
                     retries=args.judge_retries, code_weight=args.code_weight,
                     rubric_weight=1.0 - args.code_weight)


def _cmd_score(args: argparse.Namespace) -> int:
  task = resolve_task(args.task, args.task_id)
  transcript = None
  if args.transcript:
    transcript = json.loads(pathlib.Path(args.transcript).read_text(encoding="utf-8"))
  config = ScoringConfig(timeout_s=args.timeout, strict=args.strict)
  result = score(task, args.workspace, config=config, judge=_judge_config(args),
                 transcript=transcript)
  out = result.to_json()
  if not args.details:
    out.pop("details")
  out["task_id"] = task.task_id
  print(json.dumps(out, indent=None if args.compact else 2))
  return 0


def _cmd_workspace(args: argparse.Namespace) -> int:
  task = resolve_task(args.task, args.task_id)
  print(make_workspace(task, args.root))
  return 0


def _cmd_check(args: argparse.Namespace) -> int:
  tasks, errors = split_loaded(load_tasks(args.path))
  for e in errors:
    print(f"error: {e}", file=sys.stderr)
  print(json.dumps({"tasks": len(tasks), "errors": len(errors),
                    "judged": sum(t.rubric is not None for t in tasks)}))
  return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m clawjax.tasks", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="command", required=True)
  for name in ("score", "workspace"):
    p = sub.add_parser(name)
    p.add_argument("--task", required=True)
    p.add_argument("--task-id", default=None)
  p_score = sub.choices["score"]
  p_score.add_argument("--workspace", required=True)
  p_score.add_argument("--timeout", type=float, default=ScoringConfig.timeout_s,
                       help="checker wall-clock limit, seconds")
  p_score.add_argument("--strict", action="store_true",
                       help="zero metrics about referenced files that do not exist (off: official)")
  p_score.add_argument("--transcript", default=None, help="JSON list passed to grade() checkers")
  p_score.add_argument("--judge-url", default=None, help="OpenAI-compatible base URL (.../v1)")
  p_score.add_argument("--judge-model", default=None)
  p_score.add_argument("--judge-key", default=None, help="default: $CLAWJAX_JUDGE_KEY")
  p_score.add_argument("--judge-retries", type=int, default=JudgeConfig.retries)
  p_score.add_argument("--code-weight", type=float, default=JudgeConfig.code_weight)
  p_score.add_argument("--details", action="store_true", help="also print checker output tails")
  p_score.add_argument("--compact", action="store_true", help="one-line JSON")
  sub.choices["workspace"].add_argument("--root", required=True)
  p_check = sub.add_parser("check")
  p_check.add_argument("path")
  args = parser.parse_args(argv)
  try:
    return {"score": _cmd_score, "workspace": _cmd_workspace, "check": _cmd_check}[args.command](args)
  except TaskError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
