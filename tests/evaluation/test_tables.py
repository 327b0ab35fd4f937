"""Table 1 assembly: rows (harness x model), benchmark and category columns, the paper's numbers."""

import csv
import io
import json

import numpy as np
import pytest

from clawjax.evaluation.report import assemble, load_run, seeds_table
from clawjax.evaluation.results import ResultsError, ResultsWriter, load_results
from clawjax.evaluation.stats import StatsConfig, paired_test
from experiments import tables

from tests.evaluation.helpers import result_line, write_run
from tests.evaluation.test_stats import exact_bootstrap_quantile


@pytest.fixture
def runs(tmp_path):
  bench = write_run(tmp_path / "oc-bench", [
      result_line("b1", "coding", final=1.0), result_line("b2", "coding", final=0.5),
      result_line("b3", "office", final=0.25)])
  # The same row on PinchBench, split over two run directories (merged).
  pinch_a = write_run(tmp_path / "oc-pinch-a", [result_line("p1", "files", final=0.8)],
                      benchmark="PinchBench")
  pinch_b = write_run(tmp_path / "oc-pinch-b", [result_line("p2", "research", final=0.4)],
                      benchmark="PinchBench")
  toy = write_run(tmp_path / "mini-toy", [result_line("x", "data", final=0.5, harness="mini")],
                  benchmark="toy", harness="mini", model="SmolLM2-135M")
  return [bench, pinch_a, pinch_b, toy]


def test_rows_columns_and_paper_numbers(runs):
  table = assemble([load_run(d) for d in runs])
  assert table.columns == [
      "harness", "model", "PinchBench", "PinchBench (paper)", "PinchBench tasks", "ClawGym-Bench",
      "ClawGym-Bench (paper)", "ClawGym-Bench tasks", "toy", "toy tasks", "PinchBench: files",
      "PinchBench: research", "ClawGym-Bench: coding", "ClawGym-Bench: office", "toy: data"]
  rows = {tuple(r[:2]): dict(zip(table.columns, r)) for r in table.rows}
  assert len(rows) == 9 + 1  # the paper's nine rows and the toy row
  oc = rows[("OpenClaw", "Qwen3-30A3B")]
  # ClawGym-Bench: (1 + 0.5 + 0.25) / 3; coding (1 + 0.5) / 2; PinchBench (0.8 + 0.4) / 2
  assert oc["ClawGym-Bench"] == pytest.approx(175 / 3)
  assert oc["ClawGym-Bench: coding"] == pytest.approx(75.0)
  assert oc["ClawGym-Bench: office"] == pytest.approx(25.0)
  assert oc["PinchBench"] == pytest.approx(60.0)
  assert (oc["PinchBench tasks"], oc["ClawGym-Bench tasks"]) == (2, 3)
  assert (oc["PinchBench (paper)"], oc["ClawGym-Bench (paper)"]) == (55.60, 45.11)
  assert oc["toy"] is None
  cc = rows[("Claude Code", "ClawII-CC-8B")]  # a paper row no run matches
  assert (cc["PinchBench"], cc["PinchBench (paper)"], cc["ClawGym-Bench (paper)"]) == \
      (None, 61.21, 42.05)
  mini = rows[("mini", "SmolLM2-135M")]
  assert (mini["toy"], mini["toy: data"], mini["ClawGym-Bench (paper)"]) == (50.0, 50.0, None)
  assert table.rows[-1][:2] == ["mini", "SmolLM2-135M"]  # after the paper's rows


def test_cli_writes_markdown_and_csv(runs, tmp_path, capsys):
  tables.main(["--runs", *map(str, runs), "--out", str(tmp_path / "t1"), "--no-paper-rows"])
  md = (tmp_path / "t1.md").read_text()
  assert md == capsys.readouterr().out
  assert "| OpenClaw | Qwen3-30A3B | 60.00 | 55.60 | 2 | 58.33 | 45.11 | 3 |" in md
  rows = list(csv.reader(io.StringIO((tmp_path / "t1.csv").read_text())))
  assert [r[:2] for r in rows[1:]] == [["OpenClaw", "Qwen3-30A3B"], ["mini", "SmolLM2-135M"]]
  assert rows[1][3] == "55.60" and rows[1][8] == ""  # a paper cell; an empty cell


def test_a_baseline_no_run_has_is_an_error_naming_the_labels_there(runs, tmp_path):
  with pytest.raises(SystemExit) as exit_:
    tables.main(["--runs", *map(str, runs), "--baseline", "Qwen3-30A3b"])
  assert exit_.value.code == ("error: baseline 'Qwen3-30A3b' is the model label of no run given; theirs: "
                              "Qwen3-30A3B, SmolLM2-135M; did you mean Qwen3-30A3B?")
  trained = [write_run(tmp_path / "t", [result_line("b1", "coding", final=1.0)], trained_in="openclaw")]
  with pytest.raises(SystemExit) as exit_:
    tables.main(["--transfer", "--runs", *map(str, trained), "--transfer-baseline", "bse"])
  assert exit_.value.code == "error: baseline 'bse' is the trained_in of no run given; theirs: openclaw"


def test_same_task_in_two_merged_runs_is_an_error(tmp_path):
  a = write_run(tmp_path / "a", [result_line("t", "c", final=1.0)])
  b = write_run(tmp_path / "b", [result_line("t", "c", final=0.0)])
  with pytest.raises(ResultsError, match=r"'t'.*in both .*a and .*b"):
    assemble([load_run(a), load_run(b)])


def test_bad_lines(tmp_path):
  bad = result_line("t2", "c", final=1.5)
  path = write_run(tmp_path / "bad", [result_line("t1", "c", final=1.0), bad]) / "results.jsonl"
  with pytest.raises(ResultsError, match=r"results.jsonl:2: field 'final_score'"):
    load_results(path)
  # A torn last line (a run killed while writing) is skipped; the rest loads.
  torn = write_run(tmp_path / "torn", [result_line("t1", "c", final=1.0)],
                   tail=json.dumps(result_line("t2", "c", final=1.0))[:40])
  assert [r.task_id for r in load_results(torn / "results.jsonl")] == ["t1"]
  # The next writer drops the torn line before appending.
  with ResultsWriter(torn / "results.jsonl") as writer:
    writer.write(load_results(torn / "results.jsonl")[0])
  assert [r.task_id for r in load_results(torn / "results.jsonl")] == ["t1", "t1"]


def test_rows_name_their_commit_and_environments_that_differ(tmp_path, capsys):
  a = write_run(tmp_path / "a", [result_line("b1", "coding", final=1.0)])
  b = write_run(tmp_path / "b", [result_line("x", "data", final=0.5, harness="mini")], benchmark="toy",
                harness="mini", model="SmolLM2-135M")
  env = {"clawjax": {"commit": "0123456789abcdef", "dirty": False}, "python": {"version": "3.11.7"},
         "packages": {"jax": "0.10.2", "flax": "0.12.8"}, "harnesses": {"openclaw": {"lock_sha256": "aa"}},
         "engines": {}}
  (a / "environment.json").write_text(json.dumps(env))
  env["packages"]["jax"], env["clawjax"]["dirty"] = "0.11.0", True
  (b / "environment.json").write_text(json.dumps(env))
  table = assemble([load_run(a), load_run(b)], paper_rows=False)
  rows = {r[1]: dict(zip(table.columns, r)) for r in table.rows}
  assert (rows["Qwen3-30A3B"]["commit"], rows["Qwen3-30A3B"]["environment"]) == ("0123456789", "A")
  assert (rows["SmolLM2-135M"]["commit"], rows["SmolLM2-135M"]["environment"]) == ("0123456789+dirty", "B")
  tables.main(["--runs", str(a), str(b), "--no-paper-rows"])
  assert "- environment B differs from A in packages.jax: '0.10.2' -> '0.11.0'" in capsys.readouterr().out


def _seed_runs(tmp_path, model, scores_by_seed, **info):
  """One run per seed; each seed's per-task scores {task: (category, score)}."""
  return [write_run(tmp_path / f"{model}-{seed}", [result_line(t, c, final=v) for t, (c, v) in tasks.items()],
                    model=model, seed=seed, **info)
          for seed, tasks in scores_by_seed.items()]


def test_rows_over_seeds_have_mean_bootstrap_interval_and_n(tmp_path, capsys):
  rng = np.random.default_rng(3)
  tasks = {f"t{i}": ("coding" if i < 6 else "office") for i in range(10)}
  # Five seeds of one row; one seed of another row (no interval).
  seeds = {s: {t: (c, float(rng.choice([0.0, 0.5, 1.0]))) for t, c in tasks.items()} for s in range(5)}
  base = {0: {t: (c, 0.5 if c == "coding" else 0.0) for t, c in tasks.items()}}
  runs = [load_run(d) for d in _seed_runs(tmp_path, "Qwen3-30A3B", seeds) + _seed_runs(tmp_path, "base-model", base)]
  per_seed = [100 * np.mean([v for _, v in s.values()]) for s in seeds.values()]
  table = seeds_table(runs, StatsConfig(samples=20_000), baseline="base-model")
  rows = {r[1]: dict(zip(table.columns, r)) for r in table.rows}
  row = rows["Qwen3-30A3B"]
  assert (row["n"], row["tasks"], row["paper"]) == (5, 10, 45.11)
  assert row["mean"] == pytest.approx(np.mean(per_seed))
  assert exact_bootstrap_quantile(per_seed, 0.02) <= row["95% CI low"] <= exact_bootstrap_quantile(per_seed, 0.03)
  assert exact_bootstrap_quantile(per_seed, 0.97) <= row["95% CI high"] <= exact_bootstrap_quantile(per_seed, 0.98)
  base_row = rows["base-model"]
  assert (base_row["n"], base_row["95% CI low"], base_row["vs base-model"]) == (1, None, None)
  # The paired test per task: each task's mean over seeds against the baseline's.
  mine = [np.mean([seeds[s][t][1] for s in seeds]) for t in tasks]
  theirs = [base[0][t][1] for t in tasks]
  delta = 100 * (np.mean(mine) - np.mean(theirs))
  assert row["vs base-model"] == f"{delta:+.2f} (p={paired_test(mine, theirs, StatsConfig()):.3g}, 10 tasks)"
  # Categories: the mean over seeds of each seed's category score.
  cats = seeds_table(runs, StatsConfig(), categories=True)
  office = next(dict(zip(cats.columns, r)) for r in cats.rows if r[1] == "Qwen3-30A3B" and r[3] == "office")
  assert office["mean"] == pytest.approx(np.mean([100 * np.mean([v for c, v in s.values() if c == "office"])
                                                   for s in seeds.values()]))
  assert office["n"] == 5 and office["tasks"] == 4
  # Table 1 shows the mean over seeds; the CLI prints all three tables.
  t1 = {tuple(r[:2]): dict(zip(assemble(runs).columns, r)) for r in assemble(runs).rows}
  assert t1[("OpenClaw", "Qwen3-30A3B")]["ClawGym-Bench"] == pytest.approx(np.mean(per_seed))
  tables.main(["--runs", *(r.path for r in runs), "--no-paper-rows", "--baseline", "base-model"])
  out = capsys.readouterr().out
  assert "## Over seeds" in out and "## By category, over seeds" in out
  assert "| OpenClaw | Qwen3-30A3B | ClawGym-Bench | 5 |" in out


def test_repeats_must_agree_and_a_seed_may_be_split(tmp_path):
  a = write_run(tmp_path / "a", [result_line("t1", "c", final=1.0)], seed=1)
  b = write_run(tmp_path / "b", [result_line("t2", "c", final=0.0)], seed=1)  # seed 1's other half
  c = write_run(tmp_path / "c", [result_line("t1", "c", final=0.0)], seed=2, trained_in="openclaw")
  rows = seeds_table([load_run(a), load_run(b)]).rows
  assert [(r[3], r[4], r[5]) for r in rows] == [(1, 50.0, None)]
  with pytest.raises(ResultsError, match="trained_in='openclaw' differs"):
    seeds_table([load_run(a), load_run(c)])
  bad = write_run(tmp_path / "bad", [], seed="one")
  with pytest.raises(ResultsError, match="field 'seed': expected an integer"):
    load_run(bad)
