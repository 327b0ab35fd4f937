"""Workspaces hold exactly the input files, never the checker, and are fresh per call."""
import os
import pathlib

from clawjax.tasks import diff_workspace, load_jsonl, load_task_dir, make_workspace

from tests.tasks.conftest import FIXTURES


def _tree(root: pathlib.Path) -> dict[str, bytes]:
  out = {}
  for dirpath, _, names in os.walk(root):
    for n in names:
      p = pathlib.Path(dirpath) / n
      out[p.relative_to(root).as_posix()] = p.read_bytes()
  return out


def test_directory_task_workspace_mirrors_input_files(tmp_path):
  task_dir = FIXTURES / "dir" / "task_0001_summary"
  ws = make_workspace(load_task_dir(task_dir), tmp_path)
  assert _tree(ws) == _tree(task_dir / "input_files")
  ws2 = make_workspace(load_task_dir(task_dir), tmp_path)
  assert ws2 != ws and ws.parent == ws2.parent == tmp_path


def test_checker_never_in_workspace(tmp_path):
  for task in [t for t in load_jsonl(FIXTURES / "tasks.jsonl") if hasattr(t, "checker")]:
    ws = make_workspace(task, tmp_path)
    files = _tree(ws)
    assert not any(p.startswith("reward") for p in files)
    checker_bytes = {f.read() for f in task.checker.files}
    assert not checker_bytes & set(files.values())
    assert set(files) == {f.path for f in task.input_files}


def test_diff_workspace(tmp_path):
  task = load_task_dir(FIXTURES / "dir" / "task_0001_summary")
  ws = make_workspace(task, tmp_path)
  assert diff_workspace(task, ws).changed == ()
  (ws / "summary.md").write_text("hi")
  (ws / "sub").mkdir()
  (ws / "sub" / "x.txt").write_text("x")
  (ws / "data.csv").write_text("changed")
  (ws / "report.txt").unlink()
  d = diff_workspace(task, ws)
  assert d.added == ("sub/x.txt", "summary.md") and d.modified == ("data.csv",)
  assert d.deleted == ("report.txt",)
  assert d.changed == ("data.csv", "sub/x.txt", "summary.md")
