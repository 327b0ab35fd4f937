"""Every SFT config loads into a valid SFTRunConfig, documents its own command, takes any field from the
command line, and the ClawII-Cold config holds ClawGym part I's published values."""
from __future__ import annotations

import pathlib

import pytest

from clawjax import config as config_lib
from clawjax.sft.config import sft_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs" / "sft").glob("*.py")) + [ROOT / "configs" / "smollm2" / "cold_start.py"]
DATA = str(ROOT / "clawjax" / "data" / "sft" / "train.jsonl")


def _filled(path: pathlib.Path, *overrides: str):
  c = config_lib.config_module(str(path), path.name).get_config()
  for section in ("data", "heldout"):  # the paths a config leaves to its command line
    if section in c and not c[section].get("openai"):
      c[section].openai = (DATA,)
  if c.model.get("init") is None:
    c.model.init = "qwen3-30b-a3b"
  return sft_config(c, ["tensorboard=False", *overrides])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_valid_and_shows_its_command(path):
  rel = path.relative_to(ROOT).as_posix()
  assert f"python experiments/sft.py --config={rel}" in config_lib.config_module(str(path), path.name).__doc__
  cfg = _filled(path, "learner.adam_eps=1e-6", "filters.max_leaves=9", "model.overrides.remat=True")
  assert cfg.learner.loss == "sft" and cfg.learner.adam_eps == 1e-6 and cfg.filters.max_leaves == 9
  assert cfg.model.overrides["remat"] is True


def test_cold_start_30a3b_holds_the_published_values():
  cfg = _filled(ROOT / "configs" / "sft" / "cold_start_30a3b.py")
  assert (cfg.epochs, cfg.learner.lr, cfg.max_len) == (3, 1e-5, 65_536)  # ClawGym's launch script
  assert (cfg.checkpoint_every, cfg.keep_checkpoints) == (80, 10)
  # OpenRLHF train_sft's defaults, which the script leaves as they are.
  assert (cfg.learner.adam_b1, cfg.learner.adam_b2, cfg.learner.weight_decay, cfg.learner.grad_clip) == (
      0.9, 0.95, 0.0, 1.0)
  assert (cfg.warmup_ratio, cfg.min_lr_ratio) == (0.03, 0.1)
  assert cfg.model.template_family == "qwen3" and cfg.model.overrides["dtype"] == "bfloat16"
