"""Scores by category against hand-computed means, for each treatment of unscored rollouts."""

import pytest

from clawjax.evaluation.report import load_run
from clawjax.evaluation.summary import summarize

from tests.evaluation.helpers import result_line, write_run

# Two categories, five tasks; "t2" has two samples. Hand-computed task scores (unscored="zero"):
#   data:   t1 = 1.0, t2 = (0.5 + 0.0 [timeout]) / 2 = 0.25, t3 = 0.0 [failed]
#   files:  t4 = 0.75, t5 = 0.0 [error, code score 0.6, not judged]
LINES = [
    result_line("t1", "data", final=1.0, code=1.0),
    result_line("t2", "data", final=0.5, code=0.5),
    result_line("t2", "data", status="timeout", sample=1),
    result_line("t3", "data", status="failed"),
    result_line("t4", "files", final=0.75, code=1.0),
    result_line("t5", "files", status="error", code=0.6),
]


@pytest.mark.parametrize("unscored, data, files, overall, files_tasks", [
    # data = (1 + 0.25 + 0) / 3; files = (0.75 + 0) / 2; all = (1 + 0.25 + 0 + 0.75 + 0) / 5
    ("zero", 125 / 3, 37.5, 40.0, 2),
    # t5 counts its code score 0.6: files = (0.75 + 0.6) / 2, all = (1 + 0.25 + 0.75 + 0.6) / 5
    ("code", 125 / 3, 67.5, 52.0, 2),
    # t5 left out: files = 0.75, all = (1 + 0.25 + 0 + 0.75) / 4
    ("exclude", 125 / 3, 75.0, 50.0, 1),
])
def test_scores_by_category(tmp_path, unscored, data, files, overall, files_tasks):
  run = load_run(write_run(tmp_path, LINES))
  s = summarize(run.results, unscored)
  assert list(s.categories) == ["data", "files"]
  assert s.categories["data"].score == pytest.approx(data)
  assert s.categories["files"].score == pytest.approx(files)
  assert s.overall.score == pytest.approx(overall)
  assert (s.categories["data"].tasks, s.categories["files"].tasks) == (3, files_tasks)
  assert s.overall.rollouts == 6
  assert s.overall.statuses == {"ok": 3, "timeout": 1, "failed": 1, "error": 1}


def test_last_record_of_a_rollout_wins(tmp_path):
  # t3 failed first, then a resumed run scored it 0.5.
  run = load_run(write_run(tmp_path, LINES + [result_line("t3", "data", final=0.5, code=0.5)]))
  s = summarize(run.results)
  assert s.categories["data"].score == pytest.approx(100 * (1 + 0.25 + 0.5) / 3)
  assert s.overall.statuses["failed"] == 0
