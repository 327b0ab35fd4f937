"""Fixtures: the Qwen3 chat template, a fixture task whose checker looks for hello.txt, and a shim
factory (see helpers.py)."""

import contextlib

import pytest

from clawjax.tasks import parse_jsonl_task
from clawjax.text.templates import load_template

from tests.harness.helpers import CHECKER, start_shim


@pytest.fixture(scope="session")
def template():
  return load_template("qwen3")


@pytest.fixture(scope="session")
def hello_task():
  return parse_jsonl_task({
      "task_id": "hello", "prompt": "Create hello.txt containing the word hello.",
      "hook_code": "python3 reward/test.py /root/.openclaw/workspace",
      "input_files": [{"file_path": "notes.txt", "content": "write hello.txt\n"},
                      {"file_path": "reward/test.py", "content": CHECKER}]}, "test:hello")


@pytest.fixture
def make_shim(template, tmp_path):
  """make_shim(script, failures=None, **config) -> a started ShimThread (stopped after the test)."""
  with contextlib.ExitStack() as stack:
    yield lambda script, failures=None, **config: start_shim(
        stack, template, tmp_path / "logs", script, failures, **config)
