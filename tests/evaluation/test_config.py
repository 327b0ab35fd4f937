"""ConfigDict -> EvalConfig: the shipped configs build; bad fields are errors naming their path."""

import importlib.util
import pathlib

import pytest

from clawjax.config import ConfigError
from clawjax.evaluation.config import eval_config
from clawjax.evaluation.runner import rollout_config
from clawjax.tasks import load_tasks

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIGS, FIXTURES = REPO / "configs" / "eval", REPO / "tests" / "fixtures" / "tasks"
TASKS = str(FIXTURES)  # any existing task source: the config checks that it exists


def _load(name, *arg):
  spec = importlib.util.spec_from_file_location(name, CONFIGS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*arg)


def test_paper_config_needs_tasks_and_model_then_builds():
  c = _load("clawgym_bench")
  with pytest.raises(ConfigError, match=r"config.tasks: must be set"):
    eval_config(c)
  c.tasks = "bench/"
  with pytest.raises(ConfigError, match=r"config.tasks: 'bench/' does not exist"):
    eval_config(c)
  c.tasks = TASKS
  with pytest.raises(ConfigError, match=r"config.model.init: required"):
    eval_config(c)
  c.model.init = "/models/Qwen3-30B-A3B"
  cfg = eval_config(c)
  assert (cfg.shim.max_context, cfg.shim.max_new_tokens, cfg.rollout.harness.max_turns) == \
      (65536, 8192, 50)
  assert cfg.rollout.judge is None and cfg.label == "Qwen3-30B-A3B"
  c.rollout.judge.url, c.rollout.judge.model = "http://judge/v1", "judge-model"
  judge = eval_config(c).rollout.judge
  assert (judge.url, judge.code_weight, judge.rubric_weight) == ("http://judge/v1", 0.7, 0.3)


def test_paper_config_for_pinchbench():
  c = _load("clawgym_bench", "pinchbench")
  c.tasks, c.model.init = TASKS, "test-tiny"
  cfg = eval_config(c)
  assert (cfg.benchmark, cfg.task_timeouts) == ("PinchBench", True)
  with pytest.raises(ValueError, match="expected one of"):
    _load("clawgym_bench", "swebench")


def test_toy_config_builds():
  cfg = eval_config(_load("toy_cpu"))
  assert (cfg.harness, cfg.engine.backend, cfg.model.init) == ("mini", "embedded", "smollm2-135m")
  assert cfg.engine.options == {"max_slots": 2, "max_seq_len": 4096}
  assert eval_config({"tasks": TASKS, "model": {"init": "test-tiny"}}, ["task_ids=a, b,c"]).task_ids == ("a", "b", "c")
  mixed = eval_config({"tasks": TASKS, "model": {"init": "test-tiny"}}, ["trained_in=mini+openclaw", "seed=2"])
  assert (mixed.trained_in, mixed.seed) == ("mini+openclaw", 2)


def test_transfer_config_builds_both_rows():
  trained = _load("transfer_cpu")
  trained.model.init = "test-tiny"
  cfg = eval_config(trained, ["harness=codex"])
  assert (cfg.harness, cfg.trained_in, cfg.label, cfg.shim.max_context) == ("codex", "mini", "toy-mini", 16384)
  base = eval_config(_load("transfer_cpu", "base"))
  assert (base.trained_in, base.model.init, base.model.random_init) == ("base", "smollm2-135m", True)
  assert base.rollout.harness.codex_compact_reserve < base.shim.max_context
  assert eval_config({"tasks": TASKS, "model": {"init": "test-tiny"}}, ["trained_in=codex+claude_code"]).trained_in == \
      "codex+claude_code"
  with pytest.raises(ValueError, match="expected one of"):
    _load("transfer_cpu", "cold")


@pytest.mark.parametrize("section, message", [
    ({"rollout": {"harness": {"max_turn": 3}}},
     r"config.rollout.harness.max_turn: unknown field; did you mean rollout.harness.max_turns"),
    ({"rollout": {"timeout_s": "long"}}, r"config.rollout.timeout_s: expected float, got str"),
    ({"concurrency": 0}, r"config.concurrency: must be >= 1"),
    ({"harness": "cline"}, r"config.harness: 'cline' is not one of"),
    ({"rollout": {"judge": {"url": "http://judge/v1"}}},
     r"config.rollout.judge: \['model'\] must be set"),
    ({"rollout": {"sandbox": {"mode": "docker"}}}, r"config.rollout.sandbox: .*mode"),
    ({"trained_in": "cline"}, r"config.trained_in: 'cline' is not one of \('base', 'cold_start'\), a harness"),
    ({"trained_in": "mini+cline"}, r"config.trained_in: 'mini\+cline'"),
    ({"seed": "one"}, r"config.seed: expected int, got str"),
    ({"shim": {"workers": 3}}, r"config.shim.workers: 3 shim processes cannot share the embedded engine"),
    ({"harness": "codex", "shim": {"max_context": 8192}},
     r"config.rollout.harness.codex_compact_reserve: 16384 must be at least 0 and below shim.max_context"),
])
def test_bad_fields_name_their_path(section, message):
  with pytest.raises(ConfigError, match=message):
    eval_config({"tasks": TASKS, "model": {"init": "test-tiny"}, **section})


def test_task_timeouts_use_the_tasks_own_wall_clock():
  [task] = load_tasks(FIXTURES / "pinchbench" / "tasks")
  assert task.timeout_s == 120  # the fixture's timeout_seconds
  base = {"tasks": TASKS, "model": {"init": "test-tiny"}, "rollout": {"timeout_s": 900.0}}
  off = rollout_config(eval_config(base), task)
  on = rollout_config(eval_config({**base, "task_timeouts": True}), task)
  assert off is None and (on.timeout_s, on.harness.timeout_s) == (120.0, 120.0)
