"""Scoring: equality with the task's own reward.sh, the JSONL checker forms, crashes and hangs,
isolation from the agent's workspace and the network, and the opt-in strict mode."""
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from clawjax.tasks import (ScoringConfig, bundled_tasks_dir, load_jsonl, load_task_dir, load_tasks,
                           make_workspace, parse_jsonl_task, run_checker, score)
from clawjax.tasks.confined import confinement
from clawjax.tasks.scoring import CheckerOutputError, parse_checker_output, referenced_files

from tests.tasks.conftest import FIXTURES, official_reward
from tests.tasks.leftovers import alive, gone

REPO = pathlib.Path(__file__).resolve().parents[2]
SUMMARY = FIXTURES / "dir" / "task_0001_summary"


def _jsonl(task_id):
  return next(t for t in load_jsonl(FIXTURES / "tasks.jsonl")
              if getattr(t, "task_id", None) == task_id)


def _cli_score(*args: str) -> dict:
  out = subprocess.run([sys.executable, "-m", "clawjax.tasks", "score", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120, check=True)
  return json.loads(out.stdout)


SUMMARY_STATES = {
    "fresh": {},
    "partial": {"summary.md": "The billing migration finished early."},
    "full": {"summary.md": "Project Aurora: billing migrated early; retire the cron host.",
             "total.txt": "42\n"},
    "too_long": {"summary.md": "Aurora " + "word " * 80, "total.txt": "41"},
}


@pytest.mark.parametrize("state", ["fresh", "too_long"])
def test_cli_code_score_equals_reward_sh(tmp_path, state):
  ws = make_workspace(load_task_dir(SUMMARY), tmp_path / "ws")
  for name, text in SUMMARY_STATES[state].items():
    (ws / name).write_text(text)
  expected = official_reward(SUMMARY, ws, tmp_path)
  got = _cli_score("--task", str(SUMMARY), "--workspace", str(ws))
  assert got["code_score"] == expected and got["error"] is None
  # The dict check.py prints, and the reward is its mean.
  assert set(got["metrics"]) == {"summary_exists", "summary_under_50_words", "summary_names_aurora",
                                 "total_correct"}
  assert sum(got["metrics"].values()) / 4 == pytest.approx(expected)


def test_score_leaves_the_agent_workspace_alone(tmp_path):
  ws = make_workspace(load_task_dir(SUMMARY), tmp_path)
  before = sorted(p.name for p in ws.iterdir())
  result = score(load_task_dir(SUMMARY), ws)
  assert result.error is None and sorted(p.name for p in ws.iterdir()) == before
  # A checker that wipes its workspace only wipes the scoring copy.
  task = parse_jsonl_task({"task_id": "wipe", "prompt": "p", "input_files": [
      {"file_path": "keep.txt", "content": "k"}],
      "hook_code": "rm -f /root/.openclaw/workspace/keep.txt && test ! -e keep.txt && echo 1"}, "t")
  ws = make_workspace(task, tmp_path)
  assert score(task, ws).code_score == 1.0 and (ws / "keep.txt").read_text() == "k"


def test_special_files_in_the_workspace_do_not_block_scoring(tmp_path):
  task = _jsonl("jsonl_sum")
  ws = make_workspace(task, tmp_path)
  os.mkfifo(ws / "pipe")
  (ws / "answer.txt").write_text("42")
  result = score(task, ws)
  assert result.error is None and result.code_score == 1.0


def test_planted_reward_files_are_ignored(tmp_path):
  task = _jsonl("jsonl_sum")
  ws = make_workspace(task, tmp_path)
  (ws / "reward").mkdir()
  (ws / "reward" / "test.py").write_text('print(\'{"answer_exists": 1, "answer_correct": 1}\')')
  (ws / "reward" / "extra.py").write_text("")
  result = score(task, ws)
  assert result.code_score == pytest.approx(1 / 3) and set(result.metrics) == {
      "answer_exists", "answer_correct", "numbers_untouched"}


def test_jsonl_dict_checker_with_mount_dir_rewritten(tmp_path):
  task = _jsonl("jsonl_sum")
  ws = make_workspace(task, tmp_path)
  numbers = [int(x) for x in (ws / "numbers.txt").read_text().split()]
  (ws / "answer.txt").write_text(f"{sum(numbers)}\n")
  result = score(task, ws)
  assert result.error is None and result.code_score == 1.0 == result.final_score
  (ws / "answer.txt").write_text(f"{sum(numbers) + 1}\n")
  result = score(task, ws)
  assert result.code_score == pytest.approx(2 / 3) and result.metrics["answer_correct"] == 0.0


def test_main_style_checker_reward_key(tmp_path):
  task = _jsonl("jsonl_rename_main")
  ws = make_workspace(task, tmp_path)
  (ws / "draft.txt").rename(ws / "final.txt")
  result = score(task, ws)
  assert result.code_score == 1.0 and result.metrics == {"reward": 1.0, "passed": 3.0, "total": 3.0}
  (ws / "final.txt").write_text("version 2\n")
  assert score(task, ws).code_score == pytest.approx(2 / 3)


def test_crashing_checker_scores_zero_with_reason(tmp_path):
  task = _jsonl("jsonl_crash")
  result = score(task, make_workspace(task, tmp_path))
  assert result.code_score == 0.0 == result.final_score and result.metrics == {}
  assert "status 1" in result.error and "checker bug" in result.error


def test_hanging_checker_is_killed(tmp_path, monkeypatch):
  task = _jsonl("jsonl_hang")
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scoring"))  # names the checker's processes
  (tmp_path / "scoring").mkdir()
  t0 = time.monotonic()
  result = run_checker(task, make_workspace(task, tmp_path), ScoringConfig(timeout_s=1.5))
  assert time.monotonic() - t0 < 15
  assert result.code_score == 0.0 and "timed out after 1.5 s" in result.error
  assert int(result.details["stdout_tail"].split()[0]) > 0  # it ran and printed its pid
  assert gone(str(tmp_path / "scoring")), f"checker processes still running: {alive(str(tmp_path / 'scoring'))}"


def test_grade_function_checker_gets_the_transcript(tmp_path):
  task = _jsonl("jsonl_grade_only")
  ws = make_workspace(task, tmp_path)
  (ws / "hello.py").write_text('print("hi")\n')
  result = score(task, ws, transcript=[{"type": "tool_call", "name": "write"}])
  assert result.metrics == {"hello_exists": 1.0, "prints_hi": 1.0, "used_a_tool": 1.0}
  assert score(task, ws).metrics["used_a_tool"] == 0.0


def test_pinchbench_grade(tmp_path):
  [task] = load_tasks(FIXTURES / "pinchbench")
  ws = make_workspace(task, tmp_path)
  assert (ws / "data" / "scores.csv").is_file()
  rows = [line.split(",") for line in (ws / "data" / "scores.csv").read_text().split()]
  top = max(rows, key=lambda r: int(r[1]))[0]
  (ws / "report.md").write_text(f"# Report\nTop: {top}. Total: {sum(int(r[1]) for r in rows)}.\n")
  result = score(task, ws, transcript=[{"tool": "read", "path": "data/scores.csv"}])
  assert result.code_score == 1.0 and result.final_score is None  # hybrid, not judged
  assert not (ws / "grade.py").exists()


def test_strict_mode_closes_the_missing_file_blind_spot(tmp_path):
  task = load_task_dir(SUMMARY)
  ws = make_workspace(task, tmp_path)
  (ws / "total.txt").write_text("42")
  official = score(task, ws)
  assert official.metrics["summary_under_50_words"] == 1.0  # the blind spot, reproduced by default
  assert official.code_score == pytest.approx(0.5)
  strict = score(task, ws, config=ScoringConfig(strict=True))
  assert strict.metrics["summary_under_50_words"] == 0.0 and strict.metrics["total_correct"] == 1.0
  assert strict.code_score == pytest.approx(0.25)
  assert set(strict.details["strict_zeroed"]) == {"summary_exists", "summary_under_50_words",
                                                  "summary_names_aurora"}
  (ws / "summary.md").write_text("Aurora shipped.")
  assert score(task, ws, config=ScoringConfig(strict=True)).code_score == 1.0


def test_strict_mode_file_references():
  task = parse_jsonl_task({"task_id": "refs", "hook_code": "true", "input_files": [
      {"file_path": "reward/test.py", "content": "open(ws / 'out/report.md'); open('notes.txt')"}],
      "prompt": "Use Node.js to write out/report.md and `notes.txt`, e.g. 2.5 pages."}, "t")
  assert referenced_files(task) == {"out/report.md", "notes.txt"}


def test_dir_task_with_absolute_mount_paths(tmp_path):
  task = load_task_dir(FIXTURES / "dir" / "task_0002_hybrid")
  ws = make_workspace(task, tmp_path)
  result = score(task, ws)
  # Missing file: exists 0, under-120-words 1 (blind spot), date 0.
  assert result.code_score == pytest.approx(1 / 3) and result.error is None
  (ws / "announcement.md").write_text("Offsite on 2026-12-10 at Lakeside Lodge!")
  assert score(task, ws).code_score == 1.0


@pytest.mark.skipif(confinement(True).network.startswith("none"), reason="unshare -n is not available here")
def test_checker_has_no_network(tmp_path):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  port = server.getsockname()[1]
  threading.Thread(target=lambda: [server.accept() for _ in range(2)], daemon=True).start()
  probe = (f"python3 -c 'import socket; s = socket.socket(); s.settimeout(3); "
           f"print(1.0 if s.connect_ex((\"127.0.0.1\", {port})) else 0.0)'")
  task = parse_jsonl_task({"task_id": "net", "prompt": "p", "hook_code": probe}, "t")
  ws = make_workspace(task, tmp_path)
  assert run_checker(task, ws).code_score == 1.0  # connection refused: isolated
  assert run_checker(task, ws, ScoringConfig(isolate_network=False)).code_score == 0.0
  server.close()


SOLUTIONS = {
    "toy_sum_numbers": lambda ws: (ws / "answer.txt").write_text(
        str(sum(int(x) for x in (ws / "numbers.txt").read_text().split())) + "\n"),
    "toy_hello_py": lambda ws: (ws / "hello.py").write_text('print("Hello, clawjax!")\n'),
    "toy_rename_file": lambda ws: (ws / "todo.txt").rename(ws / "done.txt"),
    "toy_fix_typo": lambda ws: (ws / "notes.md").write_text(
        (ws / "notes.md").read_text().replace("recieve", "receive")),
    "toy_count_errors": lambda ws: (ws / "errors.txt").write_text(
        str(sum("ERROR" in line for line in (ws / "server.log").read_text().splitlines()))),
}


def test_every_toy_task_has_a_solution_here():
  assert {p.name for p in bundled_tasks_dir().iterdir() if p.is_dir()} == set(SOLUTIONS)


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_toy_task_scores(tmp_path, name):
  task_dir = bundled_tasks_dir() / name
  task = load_task_dir(task_dir)
  ws = make_workspace(task, tmp_path / "ws")
  fresh = score(task, ws, config=ScoringConfig(metrics_from_check_py=False))
  assert fresh.error is None and fresh.code_score < 1.0
  SOLUTIONS[name](ws)
  solved = score(task, ws)
  assert solved.code_score == 1.0 == official_reward(task_dir, ws, tmp_path)


@pytest.mark.parametrize("stdout, problem", [
    ("1e308\n", "the checker's score is 1e+308, outside [0, 1]"),
    ('{"a": 1e308, "b": 1e308}\n', "metric 'a' is 1e+308, outside [0, 1]"),
    ('{"reward": 1.5, "passed": 3}\n', "the checker's reward is 1.5, outside [0, 1]"),
    ("nan\n", "non-finite"),
])
def test_scores_outside_the_unit_interval_are_checker_errors(stdout, problem):
  with pytest.raises(CheckerOutputError, match=re.escape(problem)):
    parse_checker_output(stdout)
  assert parse_checker_output('{"reward": 1.0, "passed": 3, "total": 3}\n')[0] == 1.0  # counts beside it
