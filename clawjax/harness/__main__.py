"""`python -m clawjax.harness --shim URL --tasks PATH --harness NAME --out FILE [--n N] [...]`.

Runs N rollouts of every task under PATH (a task directory, a directory of them, or a JSONL file)
with one harness against a running shim, appending one `clawjax.rollout/1` record per rollout to FILE
(the calls are in the shim's own log dir). Tasks that fail to load are reported and skipped. Prints
the count of each status. The shim's admin token is $CLAWJAX_ADMIN_TOKEN, else the first line of
--admin-token-file (the shim writes it to LOG_DIR/admin_token).
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys

from clawjax.auth import client_admin_token
from clawjax.calllog import CallLogWriter
from clawjax.harness import sandbox
from clawjax.harness.adapters import ADAPTERS, HarnessOptions
from clawjax.harness.rollout import RolloutConfig, run_rollouts
from clawjax.tasks import load_tasks, split_loaded


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m clawjax.harness", description=__doc__)
  p.add_argument("--shim", required=True, help="the shim's root URL, e.g. http://127.0.0.1:8000")
  p.add_argument("--admin-token-file", default=None,
                 help="file holding the shim's admin token (unless $CLAWJAX_ADMIN_TOKEN is set)")
  p.add_argument("--tasks", required=True)
  p.add_argument("--harness", required=True, choices=sorted(ADAPTERS))
  p.add_argument("--out", required=True, help="JSONL file the rollout records are appended to")
  p.add_argument("--n", type=int, default=1, help="rollouts per task")
  p.add_argument("--concurrency", type=int, default=4)
  p.add_argument("--timeout-s", type=float, default=RolloutConfig.timeout_s)
  p.add_argument("--max-turns", type=int, default=HarnessOptions.max_turns)
  p.add_argument("--model", default=HarnessOptions.model)
  p.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "none"))
  p.add_argument("--work-root", default=None, help="per-rollout dirs (default: system temp)")
  p.add_argument("--keep-dirs", action="store_true")
  args = p.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

  tasks, errors = split_loaded(load_tasks(args.tasks))
  for e in errors:
    print(f"skipped: {e}", file=sys.stderr)
  config = RolloutConfig(
      timeout_s=args.timeout_s, work_root=args.work_root, keep_dirs=args.keep_dirs,
      harness=HarnessOptions(model=args.model, max_turns=args.max_turns, timeout_s=args.timeout_s),
      sandbox=sandbox.SandboxConfig(mode=args.sandbox))
  ADAPTERS[args.harness].install()
  jobs = [(t, args.harness) for t in tasks for _ in range(args.n)]
  with CallLogWriter(args.out) as writer:
    outcomes = run_rollouts(args.shim, jobs, config, writer, args.concurrency,
                            on_done=lambda o: print(f"{o.record.task_id} {o.record.rollout_id} "
                                                    f"{o.record.status} {o.record.reward}"),
                            admin_token=client_admin_token(args.admin_token_file))
  print(dict(collections.Counter(o.record.status for o in outcomes)))
  return 0 if all(o.record.status == "ok" for o in outcomes) else 1


if __name__ == "__main__":
  sys.exit(main())
