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
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from clawjax import config as config_lib
from clawjax.train.config import train_config
from clawjax.train.trainer import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/*.py", lock_config=True,
                                          sys_argv=config_lib.argv_without_overrides(sys.argv))
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, logs, metrics)")
_PRINT = flags.DEFINE_bool("print_config", False, "print the resolved config as JSON and exit")


def main(args: config_lib.Args) -> None:
  # clawjax's progress at INFO; libraries (Orbax, aiohttp, JAX) only warn.
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("clawjax").setLevel(logging.INFO)
  try:
    cfg = train_config(_CONFIG.value, args.overrides)
  except config_lib.ConfigError as e:
    sys.exit(f"error: {e}")
  if _PRINT.value:
    print(json.dumps(config_lib.to_json(cfg), indent=2))
    return
  if not _WORKDIR.value:
    sys.exit("error: --workdir is required")
  try:
    summary = train(cfg, _WORKDIR.value)
  except config_lib.ConfigError as e:  # found once the run looks at its workdir (a resume's config.json)
    sys.exit(f"error: {e}")
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  app.run(main, flags_parser=config_lib.parse_flags)
