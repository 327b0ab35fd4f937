r"""Evaluate a model behind an agent harness on a task benchmark (Table 1 of the paper).

  python experiments/eval.py --config=configs/eval/clawgym_bench.py --config.tasks=PATH \
      --config.harness=openclaw --config.model.init=DIR --config.engine.url=URL --workdir=DIR

Writes WORKDIR/results.jsonl (one line per task rollout), WORKDIR/summary.md and summary.json (scores
by category in Table 1's layout); rerunning the command resumes. Any field of clawjax/evaluation/config.py
can be set with `--config.a.b=v`; `--print_config` prints the resolved config and exits. On several hosts
the same command runs on each, with `--config.distributed.*` (docs/cluster.md): the hosts
split the tasks and process 0 writes the one results.jsonl and the summary.
"""

import logging
import sys

from absl import app

from clawjax import cli
from clawjax import distributed
from clawjax.evaluation.config import eval_config
from clawjax.evaluation.report import SUMMARY_MD
from clawjax.evaluation.results import ResultsError
from clawjax.evaluation.runner import EvalError, run_eval

_FLAGS = cli.define_flags("configs/eval/*.py", "run directory (results, call logs, summary)")


def main(args: cli.Args) -> None:
  logging.getLogger().setLevel(logging.INFO)
  with cli.exit_on_errors(EvalError, ResultsError):
    cfg, workdir = _FLAGS.resolve(args, eval_config)
    run = run_eval(cfg, workdir)
  if distributed.is_primary():
    with open(f"{run.path}/{SUMMARY_MD}", encoding="utf-8") as fh:
      sys.stdout.write(fh.read())


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
