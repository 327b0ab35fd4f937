r"""Evaluate a model behind an agent harness on a task benchmark (Table 1 of the paper).

  python experiments/eval.py --config=configs/eval/clawgym_bench.py --config.tasks=PATH \
      --config.harness=openclaw --config.model.init=DIR --config.engine.url=URL --workdir=DIR

Writes WORKDIR/results.jsonl (one line per task rollout), WORKDIR/summary.md and summary.json (scores
by category in Table 1's layout); rerunning the command resumes. Any field of clawjax/evaluation/config.py
can be set with `--config.a.b=v`; `--print_config` prints the resolved config and exits. On several hosts
the same command runs on each, with `--config.distributed.*` (README, "Running on a cluster"): the hosts
split the tasks and process 0 writes the one results.jsonl and the summary.
"""

import json
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from clawjax import config as config_lib
from clawjax import distributed
from clawjax.evaluation.config import eval_config
from clawjax.evaluation.report import SUMMARY_MD
from clawjax.evaluation.results import ResultsError
from clawjax.evaluation.runner import EvalError, run_eval

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval/*.py", lock_config=True,
                                          sys_argv=config_lib.argv_without_overrides(sys.argv))
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (results, call logs, summary)")
_PRINT = flags.DEFINE_bool("print_config", False, "print the resolved config as JSON and exit")


def main(args: config_lib.Args) -> None:
  logging.getLogger().setLevel(logging.INFO)
  try:
    cfg = eval_config(_CONFIG.value, args.overrides)
    if _PRINT.value:
      print(json.dumps(config_lib.to_json(cfg), indent=2))
      return
    if not _WORKDIR.value:
      sys.exit("error: --workdir is required")
    run = run_eval(cfg, _WORKDIR.value)
  except (config_lib.ConfigError, EvalError, ResultsError) as e:
    sys.exit(f"error: {e}")
  if distributed.is_primary():
    with open(f"{run.path}/{SUMMARY_MD}", encoding="utf-8") as fh:
      sys.stdout.write(fh.read())


if __name__ == "__main__":
  app.run(main, flags_parser=config_lib.parse_flags)
