"""Loading the task layouts: fields, validation errors that name the task and field, isolation of
broken tasks, and the bundled toy tasks."""
import json
import pathlib

import pytest

from clawjax.tasks import (TaskError, bundled_tasks_dir, load_jsonl, load_task_dir, load_tasks,
                           parse_jsonl_task, select_tasks, split_loaded)
from clawjax.tasks.__main__ import main, resolve_task

from tests.tasks.conftest import FIXTURES


def test_directory_layout_fields():
  task = load_task_dir(FIXTURES / "dir" / "task_0001_summary")
  entry = json.loads((FIXTURES / "dir" / "task_0001_summary" / "data_entry.json").read_text())
  assert task.task_id == entry["task_id"] and task.prompt == entry["user_query"]
  assert task.category == "office" and task.grading_type == "automated"
  assert task.mount_dir == "/root/.openclaw/workspace" and task.rubric is None
  assert sorted(f.path for f in task.input_files) == ["data.csv", "report.txt"]
  assert task.checker.kind == "command" and task.checker.command == "bash reward/reward.sh"
  assert sorted(f.path for f in task.checker.files) == ["reward/check.py", "reward/reward.sh"]


def test_directory_layout_rubric():
  task = load_task_dir(FIXTURES / "dir" / "task_0002_hybrid")
  assert task.rubric.score_options == (0, 0.25, 0.5, 0.75, 1)
  assert [r.name for r in task.rubric.rules] == ["tone", "completeness"]
  assert task.rubric.rules[0].file_path == "announcement.md"
  assert task.rubric.rules[1].scores["0.5"] == "Has one of date and place."


def test_jsonl_layout_keeps_going_past_broken_lines():
  items = load_jsonl(FIXTURES / "tasks.jsonl")
  assert len(items) == 9
  tasks, errors = split_loaded(items)
  assert [t.task_id for t in tasks] == ["jsonl_sum", "jsonl_rename_main", "jsonl_hybrid_reply",
                                        "jsonl_crash", "jsonl_hang", "jsonl_grade_only"]
  by_line = {e.where.rsplit(":", 1)[1]: e for e in errors}
  assert set(by_line) == {"6", "7", "8"}
  assert by_line["6"].task_id == "jsonl_broken" and "invalid JSON" in str(by_line["6"])
  assert by_line["7"].task_id == "jsonl_no_prompt" and by_line["7"].field == "prompt"
  assert by_line["8"].task_id == "jsonl_escape" and by_line["8"].field == "input_files[1].file_path"
  assert "tasks.jsonl:8" in str(by_line["8"]) and "'jsonl_escape'" in str(by_line["8"])


def test_jsonl_reward_files_are_the_checker_not_inputs():
  task = next(t for t in load_jsonl(FIXTURES / "tasks.jsonl") if t.task_id == "jsonl_sum")
  assert [f.path for f in task.input_files] == ["numbers.txt"]
  assert [f.path for f in task.checker.files] == ["reward/test.py"]
  assert task.checker.command == "python3 reward/test.py /root/.openclaw/workspace"
  hybrid = next(t for t in load_jsonl(FIXTURES / "tasks.jsonl") if t.task_id == "jsonl_hybrid_reply")
  assert hybrid.grading_type == "hybrid" and len(hybrid.rubric.rules) == 2  # rules given as a string
  grade_only = next(t for t in load_jsonl(FIXTURES / "tasks.jsonl") if t.task_id == "jsonl_grade_only")
  assert grade_only.checker.kind == "grade" and grade_only.checker.entry == "reward/test.py"


@pytest.mark.parametrize("obj, field", [
    ({"prompt": "p", "hook_code": 3}, "hook_code"),
    ({"prompt": "p"}, "hook_code"),
    ({"prompt": "p", "hook_code": "true", "input_files": "x"}, "input_files"),
    ({"prompt": "p", "hook_code": "true", "input_files": [{"file_path": "/etc/passwd", "content": ""}]},
     "input_files[0].file_path"),
    ({"prompt": "p", "hook_code": "true", "input_files": [{"file_path": "a", "content": 1}]},
     "input_files[0].content"),
    ({"prompt": "p", "hook_code": "true", "rules": {"rules": []}}, "rules.rules"),
    ({"prompt": "p", "hook_code": "true", "rules": {"rules": [{"name": "a"}, {"name": "a"}]}},
     "rules.rules[1].name"),
    ({"prompt": "p", "hook_code": "true", "rules": "{not json"}, "rules"),
    ({"prompt": "", "hook_code": "true"}, "prompt"),
])
def test_jsonl_validation_names_the_field(obj, field):
  with pytest.raises(TaskError) as e:
    parse_jsonl_task({"task_id": "t1", **obj}, "x.jsonl:4")
  assert e.value.field == field and e.value.task_id == "t1" and "x.jsonl:4" in str(e.value)


def test_directory_errors(tmp_path):
  d = tmp_path / "task_bad"
  d.mkdir()
  (d / "data_entry.json").write_text('{"task_id": "task_bad", "metadata": {}}')
  (d / "reward").mkdir()
  with pytest.raises(TaskError) as e:
    load_task_dir(d)
  assert e.value.field == "user_query" and e.value.task_id == "task_bad"
  (d / "data_entry.json").write_text('{"task_id": "task_bad", "user_query": "q"}')
  with pytest.raises(TaskError, match="neither reward.sh nor check.py"):
    load_task_dir(d)
  (d / "data_entry.json").write_text("[1]")
  with pytest.raises(TaskError, match="expected a JSON object"):
    load_task_dir(d)


def test_load_tasks_on_a_directory_of_tasks_isolates_failures(tmp_path):
  good = FIXTURES / "dir" / "task_0001_summary"
  bad = tmp_path / "task_broken"
  bad.mkdir()
  (bad / "data_entry.json").write_text("{")
  (tmp_path / "task_good").symlink_to(good, target_is_directory=True)
  items = load_tasks(tmp_path)
  assert [type(t).__name__ for t in items] == ["TaskError", "Task"]
  assert "task_broken" in str(items[0])


def test_pinchbench_markdown():
  [task] = load_tasks(FIXTURES / "pinchbench")
  assert task.task_id == "task_fixture_report" and task.grading_type == "hybrid"
  assert task.prompt.startswith("Read `data/scores.csv`") and task.timeout_s == 120
  assert task.code_weight == pytest.approx(0.6)
  assert {f.path: f.read() for f in task.input_files} == {
      "data/scores.csv": (FIXTURES / "pinchbench" / "assets" / "scores.csv").read_bytes(),
      "README.txt": b"Scores are per player.\n"}
  assert task.checker.kind == "grade" and b"def grade(" in task.checker.files[0].read()
  assert [(r.name, r.weight) for r in task.rubric.rules] == [("Clarity", 75.0), ("Formatting", 25.0)]
  assert task.rubric.score_options == (0.0, 0.5, 1.0)


def test_pinchbench_errors(tmp_path):
  md = tmp_path / "t.md"
  md.write_text("---\nid: t\ngrading_type: automated\n---\n## Prompt\nDo it.\n")
  [err] = load_tasks(md)
  assert isinstance(err, TaskError) and err.field == "## Automated Checks" and err.task_id == "t"
  md.write_text("---\nid: t\nworkspace_files:\n  - source: nope.txt\n---\n## Prompt\nx\n"
                "## Automated Checks\n```python\ndef grade(t, w):\n  return {}\n```\n")
  [err] = load_tasks(md)
  assert isinstance(err, TaskError) and err.field == "workspace_files[0].source"


def test_resolve_task_forms():
  jsonl = FIXTURES / "tasks.jsonl"
  assert resolve_task(f"{jsonl}:2").task_id == "jsonl_rename_main"
  line = jsonl.read_text().splitlines()[0]
  assert resolve_task(line).task_id == "jsonl_sum"
  assert resolve_task(str(jsonl), "jsonl_hang").task_id == "jsonl_hang"
  assert resolve_task(str(FIXTURES / "dir" / "task_0001_summary")).task_id == "task_0001_summary"
  with pytest.raises(TaskError, match="holds 9 tasks"):
    resolve_task(str(jsonl))
  with pytest.raises(TaskError) as e:
    resolve_task(f"{jsonl}:7")
  assert e.value.field == "prompt"


def test_check_command(capsys):
  assert main(["check", str(FIXTURES / "tasks.jsonl")]) == 1
  out, err = capsys.readouterr()
  assert json.loads(out) == {"tasks": 6, "errors": 3, "judged": 1} and err.count("error:") == 3
  assert main(["check", str(bundled_tasks_dir())]) == 0


def test_bundled_toy_tasks_load():
  tasks, errors = split_loaded(load_tasks(bundled_tasks_dir()))
  assert not errors
  assert len(tasks) >= 4 and all(t.checker and t.checker.kind == "command" for t in tasks)
  assert all(pathlib.Path(t.source).name == t.task_id for t in tasks)


def _jsonl_task(task_id: str) -> str:
  return json.dumps({"task_id": task_id, "prompt": f"Do {task_id}.", "hook_code": "true"}) + "\n"


def test_select_tasks_filters_in_load_order(tmp_path):
  jsonl = tmp_path / "t.jsonl"
  jsonl.write_text("".join(_jsonl_task(i) for i in ("a", "b", "c", "d")))
  assert [t.task_id for t in select_tasks(jsonl)] == ["a", "b", "c", "d"]
  assert [t.task_id for t in select_tasks(jsonl, ("d", "b"))] == ["b", "d"]
  assert [t.task_id for t in select_tasks(jsonl, max_tasks=2)] == ["a", "b"]
  assert [t.task_id for t in select_tasks(jsonl, ("c", "b", "d"), max_tasks=2)] == ["b", "c"]
  with pytest.raises(ValueError, match="max_tasks"):
    select_tasks(jsonl, max_tasks=-1)


def test_select_tasks_rejects_duplicate_ids_naming_them_and_their_sources(tmp_path):
  (tmp_path / "one.jsonl").write_text(_jsonl_task("a") + _jsonl_task("b"))
  (tmp_path / "two.jsonl").write_text(_jsonl_task("c") + _jsonl_task("a"))
  with pytest.raises(ValueError) as e:
    select_tasks(tmp_path, ("c",))  # even when the repeated id is not among those asked for
  message = str(e.value)
  assert "'a'" in message and "'b'" not in message and "'c'" not in message
  assert "one.jsonl:1" in message and "two.jsonl:2" in message and str(tmp_path) in message


def test_select_tasks_names_unknown_and_broken_ids_and_refuses_an_empty_set(tmp_path):
  jsonl = tmp_path / "t.jsonl"
  jsonl.write_text(_jsonl_task("a") + '{"task_id": "broken", "hook_code": "true"}\n')
  with pytest.raises(ValueError) as e:
    select_tasks(jsonl, ("a", "nope", "broken"))
  message = str(e.value)
  assert "'nope'" in message and "'broken' (broken: " in message and "field 'prompt'" in message
  assert "'a'" not in message.split("not among")[0]
  empty = tmp_path / "empty.jsonl"
  empty.write_text('{"task_id": "broken", "hook_code": "true"}\n')
  with pytest.raises(ValueError, match=r"no loadable task; the first of 1 broken: .*empty.jsonl:1"):
    select_tasks(empty)
