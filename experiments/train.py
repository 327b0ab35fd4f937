r"""Train the model behind a black-box agent harness with RL (ClawGym II).

  python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart
  python experiments/train.py --config=configs/paper/grpo_openclaw_30a3b.py --config.tasks=PATH \
      --config.engine.url=URL --workdir=DIR

Rerunning a command resumes from WORKDIR's last checkpoint. Ends by printing one JSON line: steps,
reward_first5, reward_last5 (mean reward of the first and last five RL steps), wall_s. See
clawjax/rl/loop.py.
"""

import json
import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from clawjax.rl.loop import train
from clawjax.rl.loop_config import train_config

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/*.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, logs, metrics)", required=True)


def main(argv: list[str]) -> None:
  del argv
  # clawjax's progress at INFO; libraries (Orbax, aiohttp, JAX) only warn.
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("clawjax").setLevel(logging.INFO)
  print(json.dumps(train(train_config(_CONFIG.value), _WORKDIR.value)), flush=True)


if __name__ == "__main__":
  app.run(main)
