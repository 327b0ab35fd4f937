r"""Evaluate a model behind an agent harness on a task benchmark (issue 6; Table 1 of the paper).

  python experiments/eval.py --config=configs/eval/clawgym_bench.py --config.tasks=PATH \
      --config.harness=openclaw --config.engine.model=DIR --config.engine.url=URL --workdir=DIR

Writes WORKDIR/results.jsonl (one line per task rollout), WORKDIR/summary.md and summary.json (scores
by category in Table 1's layout); rerunning the command resumes. See clawjax/evaluation/.
"""

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from clawjax.evaluation.config import ConfigError, eval_config
from clawjax.evaluation.report import SUMMARY_MD
from clawjax.evaluation.results import ResultsError
from clawjax.evaluation.runner import EvalError, run_eval

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/eval/*.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (results, call logs, summary)",
                               required=True)


def main(argv: list[str]) -> None:
  del argv
  logging.getLogger().setLevel(logging.INFO)
  try:
    run = run_eval(eval_config(_CONFIG.value), _WORKDIR.value)
  except (ConfigError, EvalError, ResultsError) as e:
    sys.exit(f"error: {e}")
  with open(f"{run.path}/{SUMMARY_MD}", encoding="utf-8") as fh:
    sys.stdout.write(fh.read())


if __name__ == "__main__":
  app.run(main)
