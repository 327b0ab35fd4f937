"""Shared helpers: the real shim (in-process, scripted backend standing for the model), the fixture
task's checker, and reading a rollout's call log back as a filtered tree."""

import contextlib
import json

import pytest

from clawjax import calllog
from clawjax.harness import install
from clawjax.harness.adapters import get_adapter
from clawjax.serving.backends.scripted import ScriptedBackend
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.tree.filters import filter_rollout

CHECKER = """import json, pathlib, sys
ws = pathlib.Path(sys.argv[1])
f = ws / "hello.txt"
print(json.dumps({"exists": float(f.is_file()),
                  "content": float(f.is_file() and f.read_text().strip() == "hello")}))
"""


def install_or_skip(name: str) -> None:
  """Installs harness `name` from npm, or skips the test where npm or its registry is unreachable."""
  try:
    get_adapter(name).install()
  except install.NpmUnreachable as e:
    pytest.skip(f"npm unreachable, cannot install {name}: {e}")


def mode_id(param: tuple[str, bool]) -> str:
  """The test id of a (harness, incremental stream) parameter."""
  return param[0] + ("-incremental" if param[1] else "")


def start_shim(stack: contextlib.ExitStack, template, log_dir, script, failures=None,
               backend_options=None, **config):
  """A started ShimThread on the scripted backend, stopped when `stack` closes."""
  backend = ScriptedBackend(template, script, failures=failures, **(backend_options or {}))
  cfg = ShimConfig(log_dir=str(log_dir), **config)
  return stack.enter_context(ShimThread(cfg, backend, template))


def load_rollout(log_dir, rollout_id):
  """(calls, rollout record, filtered tree) of one rollout, through the public loader."""
  log = calllog.load(log_dir)
  assert not log.problems, log.problems
  calls = log.calls.get(rollout_id, [])
  return calls, log.rollouts.get(rollout_id), filter_rollout(rollout_id, calls)


def decode_input(template, ids) -> str:
  return template.tokenizer.decode(list(ids))


def dumps(obj) -> str:
  return json.dumps(obj, indent=1)[:4000]
