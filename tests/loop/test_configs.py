"""Every training config loads into a valid TrainConfig, documents its own command, and a mistyped
field is an error naming its path."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest

from clawjax.evaluation.config import ConfigError
from clawjax.rl.loop_config import train_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.py")) + sorted((ROOT / "configs" / "paper").glob("*.py"))


def _load(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_valid_and_shows_its_command(path):
  module = _load(path)
  rel = path.relative_to(ROOT).as_posix()
  assert f"python experiments/train.py --config={rel}" in module.__doc__
  c = module.get_config()
  if c.tasks is None:
    c.tasks = "TASKS"
  if c.model.get("init") is None:
    c.model.init = "MODEL_DIR"
  cfg = train_config(c)
  assert cfg.learner.temperature == cfg.shim.temperature
  assert cfg.tasks_per_step * cfg.rollouts_per_task * len(cfg.harnesses) in (256, 32)  # paper / quickstart


def test_paper_configs_follow_the_paper():
  by_name = {p.stem: train_config(_fill(_load(p).get_config())) for p in CONFIGS if p.parent.name == "paper"}
  assert by_name["mix_harness_30a3b"].harnesses == ("openclaw", "claude_code")
  assert by_name["ppo_openclaw_30a3b"].learner.loss == "ppo"
  assert (by_name["ppo_openclaw_30a3b"].tasks_per_step, by_name["ppo_openclaw_30a3b"].rollouts_per_task) == (256, 1)
  assert all(c.shim.max_context == 65_536 for c in by_name.values())


def _fill(c):
  c.tasks, c.model.init = "TASKS", "MODEL_DIR"
  return c


def test_bad_field_names_its_path():
  c = _load(ROOT / "configs" / "quickstart.py").get_config().to_dict()
  c["rollout"]["harness"]["max_turn"] = 3
  with pytest.raises(ConfigError, match=r"config\.rollout\.harness"):
    train_config(c)
  c = _load(ROOT / "configs" / "quickstart.py").get_config().to_dict()
  c["learner"]["temperature"] = 0.7
  with pytest.raises(ConfigError, match=r"config\.learner\.temperature"):
    train_config(c)
