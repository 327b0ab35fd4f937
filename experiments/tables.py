r"""Assemble evaluation runs into the paper's Table 1 layout, the paper's numbers alongside.

  python experiments/tables.py --runs runs/eval/oc-qwen3-30a3b runs/eval/oc-qwen3-30a3b-pinch ... \
      [--out runs/table1] [--no-paper-rows]

Prints Markdown; with --out also writes OUT.md and OUT.csv. Runs that recorded their environment add each
row's clawjax commit and environment (A, B, ...) and say how environments differ. See
clawjax/evaluation/report.py.
"""

import argparse
import pathlib
import sys

from clawjax.evaluation.report import assemble, environment_legend, load_run


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", nargs="+", required=True, help="eval.py --workdir directories")
  parser.add_argument("--out", default=None, help="write OUT.md and OUT.csv")
  parser.add_argument("--no-paper-rows", action="store_true",
                      help="leave out the paper's rows that no run matches")
  args = parser.parse_args(argv)
  runs = [load_run(d) for d in args.runs]
  table = assemble(runs, paper_rows=not args.no_paper_rows)
  text = table.markdown() + environment_legend(runs)
  sys.stdout.write(text)
  if args.out:
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    out.with_suffix(".csv").write_text(table.csv(), encoding="utf-8")


if __name__ == "__main__":
  main()
