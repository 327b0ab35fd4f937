r"""What a run did, as one self-contained HTML page: WORKDIR/report.html (training and evaluation write it
when they finish; this redraws it).

  python experiments/report.py --workdir runs/quickstart [--tokenizer qwen3|MODEL_DIR]

The config, the curves from metrics.jsonl, the last step's failures by reason and its best and worst
rollouts linked to their trees (WORKDIR/report/*.html), the evaluation summary. See clawjax/report/run.py.
"""

import argparse
import os
import sys

from clawjax.report.run import write_report


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--workdir", required=True, help="a train.py or eval.py --workdir")
  parser.add_argument("--tokenizer", default=None,
                      help="decode tokens with this tokenizer name or model dir (default: the run's model)")
  args = parser.parse_args(argv)
  try:
    if not os.path.isdir(args.workdir):
      raise ValueError(f"{args.workdir}: no such run directory")
    print(write_report(args.workdir, args.tokenizer))
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
