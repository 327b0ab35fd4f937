r"""Assemble evaluation runs into the paper's Table 1 layout, the paper's numbers alongside, then the same
rows over seeds (mean, bootstrap interval, n) and by category; or the harness transfer matrix.

  python experiments/tables.py --runs runs/eval/oc-qwen3-30a3b runs/eval/oc-qwen3-30a3b-pinch ... \
      [--out runs/table1] [--no-paper-rows] [--baseline Qwen3-30A3B]
  python experiments/tables.py --transfer --runs runs/eval/* [--out runs/transfer]

Prints Markdown; with --out also writes OUT.md and OUT.csv (Table 1, or with --transfer the matrix of
each benchmark as OUT.<benchmark>.csv). Runs that recorded their environment add each row's clawjax
commit and environment (A, B, ...) and say how environments differ. Runs of one (harness, model,
benchmark) with different `--config.seed` are repeats: the tables give their mean, a bootstrap interval
over seeds and n. `--baseline MODEL` adds a paired test per task of every row against that model's row
(same harness and benchmark). `--transfer`: rows = the harness a policy was trained in
(`--config.trained_in` of each eval run: a harness, base, cold_start), columns = the harness it was
evaluated in, each cell the benchmark's mean with its bootstrap interval over tasks (and seeds), each
with a paired test per task against the base row. See clawjax/evaluation/report.py and stats.py.
"""

import argparse
import pathlib
import re
import sys

from clawjax.evaluation.report import BASE, assemble, environment_legend, load_run, seeds_table, transfer_tables
from clawjax.evaluation.results import ResultsError
from clawjax.evaluation.stats import StatsConfig


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", nargs="+", required=True, help="eval.py --workdir directories")
  parser.add_argument("--out", default=None, help="write OUT.md and OUT.csv")
  parser.add_argument("--no-paper-rows", action="store_true",
                      help="leave out the paper's rows that no run matches")
  parser.add_argument("--baseline", default=None, help="a model label: paired test of each row against it")
  parser.add_argument("--transfer", action="store_true", help="the trained-in x evaluated-in matrix")
  parser.add_argument("--transfer-baseline", default=None,
                      help=f"the transfer matrix's row every other is tested against (default {BASE})")
  defaults = StatsConfig()
  parser.add_argument("--confidence", type=float, default=defaults.confidence, help="of the bootstrap interval")
  parser.add_argument("--samples", type=int, default=defaults.samples,
                      help="bootstrap resamples, and random sign patterns of the paired test")
  parser.add_argument("--stats-seed", type=int, default=defaults.seed, help="seed of both")
  args = parser.parse_args(argv)
  try:
    stats = StatsConfig(confidence=args.confidence, samples=args.samples, seed=args.stats_seed)
    runs = [load_run(d) for d in args.runs]
    csvs = {}
    if args.transfer:
      parts = []
      for bench, table in transfer_tables(runs, stats, args.transfer_baseline):
        parts.append(f"## {bench}: trained in (rows) x evaluated in (columns)\n\n{table.markdown()}")
        csvs[f".{re.sub(r'[^A-Za-z0-9_.-]+', '_', bench)}.csv"] = table.csv()
      text = "\n".join(parts) or "No run states `trained_in` (eval.py --config.trained_in=...).\n"
    else:
      table = assemble(runs, paper_rows=not args.no_paper_rows)
      csvs[".csv"] = table.csv()
      by_seed = seeds_table(runs, stats, args.baseline)
      by_category = seeds_table(runs, stats, args.baseline, categories=True)
      text = (table.markdown() + environment_legend(runs) + f"\n## Over seeds\n\n{by_seed.markdown()}"
              + f"\n## By category, over seeds\n\n{by_category.markdown()}")
  except (ResultsError, ValueError) as e:
    sys.exit(f"error: {e}")
  sys.stdout.write(text)
  if args.out:
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text, encoding="utf-8")
    for suffix, content in csvs.items():
      out.with_name(out.name + suffix).write_text(content, encoding="utf-8")


if __name__ == "__main__":
  main()
