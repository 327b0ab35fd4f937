"""Shared fixtures: a shim on its own thread, scripted backend, the real Qwen3 template."""
import contextlib

import pytest

from clawjax.serving.backends.scripted import ScriptedBackend
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.text.templates import load_template


@pytest.fixture(scope="session")
def template():
  return load_template("qwen3")


@pytest.fixture
def make_shim(template, tmp_path):
  """make_shim(script, **config) -> a started ShimThread (stopped after the test); Qwen3's template
  unless `chat_template` is given."""
  with contextlib.ExitStack() as stack:

    def make(script, failures=None, backend=None, chat_template=None, **config):
      chat_template = chat_template or template
      backend = backend or ScriptedBackend(chat_template, script, failures=failures)
      cfg = ShimConfig(log_dir=str(tmp_path / "logs"), **config)
      return stack.enter_context(ShimThread(cfg, backend, chat_template))

    yield make
