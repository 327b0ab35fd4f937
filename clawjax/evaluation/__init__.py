"""Benchmark evaluation (experiments/eval.py) and the paper's Table 1 (experiments/tables.py).

config.py   the typed EvalConfig, built from an ml_collections ConfigDict (configs/eval/*.py)
runner.py   run_eval: tasks through a harness against the shim, resumable, per-task results
results.py  the results JSONL record (`clawjax.eval/1`)
summary.py  scores per benchmark and category (mean final score in percent)
report.py   run directories, Table 1 assembly next to the paper's numbers (paper.py), summaries, tables over
            seeds and the harness transfer matrix
stats.py    bootstrap interval of a mean, paired sign-flip test per task
table.py    Markdown / CSV rendering
"""
