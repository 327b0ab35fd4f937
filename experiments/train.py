r"""Train the model behind a black-box agent harness with RL (ClawGym II).

  python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart
  python experiments/train.py --config=configs/paper/grpo_openclaw_30a3b.py --config.tasks=PATH \
      --config.engine.url=URL --workdir=DIR

Any field of the run's config (clawjax/train/config.py) can be set with `--config.a.b=v`, whether or not
the config file sets it; `--print_config` prints the resolved config and exits. Rerunning a command
resumes from WORKDIR's last checkpoint. Ends by printing one JSON line: steps, reward_first5,
reward_last5 (mean reward of the first and last five RL steps), wall_s.
"""

import json
import logging

from absl import app
from absl import logging as absl_logging

from clawjax import cli
from clawjax.train.config import train_config
from clawjax.tree.vocab import VocabularyError
from clawjax.train.trainer import train

_FLAGS = cli.define_flags("configs/*.py", "run directory (checkpoints, logs, metrics)")


def main(args: cli.Args) -> None:
  # clawjax's progress at INFO; libraries (Orbax, aiohttp, JAX) only warn.
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("clawjax").setLevel(logging.INFO)
  with cli.exit_on_errors(VocabularyError):
    cfg, workdir = _FLAGS.resolve(args, train_config)
    summary = train(cfg, workdir)
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
