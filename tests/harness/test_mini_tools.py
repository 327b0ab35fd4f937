"""The mini harness's tools against the real file system, and its malformed-call checks."""

import json

import pytest

from clawjax.harness.mini.tools import ToolCallError, Toolbox


@pytest.fixture
def box(tmp_path):
  return Toolbox(tmp_path, bash_timeout_s=10, max_output_chars=200)


def test_tools_act_on_the_workspace(box, tmp_path):
  assert box.run("write", {"path": "d/a.txt", "content": "one two one"}).startswith("wrote")
  assert (tmp_path / "d" / "a.txt").read_text() == "one two one"
  assert box.run("read", {"path": "d/a.txt"}) == "one two one"
  assert "exactly once" in box.run("edit", {"path": "d/a.txt", "old_text": "one", "new_text": "1"})
  box.run("edit", {"path": "d/a.txt", "old_text": "two", "new_text": "2"})
  assert (tmp_path / "d" / "a.txt").read_text() == "one 2 one"
  assert box.run("ls", {}) == "d/"
  assert box.run("bash", {"command": "cat d/a.txt; exit 3"}) == "exit code 3\none 2 one"
  assert box.run("read", {"path": "missing"}).startswith("error:")
  assert box.run("bash", {"command": "seq 1 1000"}).endswith("chars]")  # output is capped


def test_schemas_are_openai_function_tools(box):
  schemas = box.schemas()
  assert [s["function"]["name"] for s in schemas] == ["read", "write", "edit", "bash", "ls"]
  for s in schemas:
    assert s["type"] == "function"
    params = s["function"]["parameters"]
    assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
  json.dumps(schemas)


@pytest.mark.parametrize("name, args, message", [
    ("rm", {}, "unknown tool"),
    ("write", {"path": "a"}, "missing argument 'content'"),
    ("write", {"path": "a", "content": 3}, "must be a string"),
    ("read", {"path": "a", "mode": "r"}, "unknown argument"),
    ("read", ["a"], "JSON object"),
])
def test_malformed_calls_are_rejected(box, name, args, message):
  with pytest.raises(ToolCallError, match=message):
    box.check(name, args)
