r"""Turn a training run's metrics into PNG curves.

  python experiments/plot.py --workdir=runs/quickstart [--out=DIR]

Writes reward.png (RL reward per step, held-out eval, SFT loss) and learner.png (entropy, KL, clip and
TIS-truncation fractions, grad norm) from WORKDIR/metrics.jsonl.
"""

import sys

from absl import app, flags

from clawjax.train.plots import plot_run

_WORKDIR = flags.DEFINE_string("workdir", None, "run directory holding metrics.jsonl", required=True)
_OUT = flags.DEFINE_string("out", None, "where to write the PNGs (default: the run directory)")


def main(argv: list[str]) -> None:
  del argv
  try:
    paths = plot_run(_WORKDIR.value, _OUT.value)
  except (ValueError, OSError) as e:  # no metrics, a bad line of metrics.jsonl, an unwritable --out
    sys.exit(f"error: {e}")
  for path in paths:
    print(path)


if __name__ == "__main__":
  app.run(main)
