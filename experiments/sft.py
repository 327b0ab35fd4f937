r"""Cold-start SFT (ClawII-Cold) or rejection-sampling fine-tuning, in JAX on the RL learner.

  python experiments/sft.py --config=configs/sft/cpu_small.py --workdir=runs/sft-cpu
  python experiments/sft.py --config=configs/sft/cold_start_30a3b.py --config.data.openai=SFT.jsonl \
      --config.model.init=PATH/Qwen3-30B-A3B --workdir=runs/cold_30a3b
  python experiments/sft.py --config=configs/sft/cpu_small.py --config.data.openai= \
      --config.data.calls=runs/eval/toy --config.min_score=1.0 --workdir=runs/rft   # RFT from a run

Sources: `data.openai` / `data.anthropic` (trajectory JSONL), `data.calls` (train or eval run dirs,
rollouts scored >= min_score). Any field of the config (clawjax/sft/config.py) can be set with
`--config.a.b=v`; `--print_config` prints the resolved config. Rerunning a command resumes from WORKDIR's
last checkpoint. The trained model goes to WORKDIR/hf (a Hugging Face directory: pass it to train.py as
`--config.model.init`). Ends by printing the summary as one JSON line.

Several hosts run one stage with the same command on each (docs/cluster.md), e.g.
  python experiments/sft.py --config=... --workdir=SHARED/runs/sft --config.mesh.data=-1 \
      --config.distributed.num_processes=2 --config.distributed.process_id=I \
      --config.distributed.coordinator=HOST0:PORT
"""

import json
import logging

from absl import app
from absl import logging as absl_logging

from clawjax import cli, distributed
from clawjax.sft.config import sft_config
from clawjax.sft.data import DataError
from clawjax.sft.stage import run_stage
from clawjax.train.metrics import MetricsWriter
from clawjax.tree.vocab import VocabularyError

_FLAGS = cli.define_flags("configs/sft/*.py", "run directory (checkpoints, metrics, hf export)")


def main(args: cli.Args) -> None:
  absl_logging.set_verbosity(absl_logging.WARNING)  # clawjax's progress at INFO; libraries only warn
  logging.getLogger("clawjax").setLevel(logging.INFO)
  with cli.exit_on_errors(DataError, VocabularyError):
    cfg, workdir = _FLAGS.resolve(args, sft_config)
    distributed.initialize(cfg.distributed)  # before anything touches JAX
    metrics = MetricsWriter(workdir, cfg.tensorboard, enabled=distributed.is_primary())
    try:
      summary = run_stage(cfg, workdir, metrics)
    finally:
      metrics.close()
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
