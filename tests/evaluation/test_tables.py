"""Table 1 assembly: rows (harness x model), benchmark and category columns, the paper's numbers."""

import csv
import io
import json

import pytest

from clawjax.evaluation.report import assemble, load_run
from clawjax.evaluation.results import ResultsError, ResultsWriter, load_results
from experiments import tables

from tests.evaluation.helpers import result_line, write_run


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
