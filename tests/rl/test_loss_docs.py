"""The manual's loss tutorial (docs/learner.md, "Write your own loss") runs as written: its plugin file,
its offline check, its REINFORCE-with-baseline example (whose critic must learn); and its sequence-level
loss equals the formula in its docstring against the per-path float64 reference."""
from __future__ import annotations

import pathlib
import re
import runpy
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.config import ConfigError
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.loss_check import TINY, example_batch, tiny_policy
from clawjax.rl.losses import LOSSES
from clawjax.rl.value import make_value_model
from clawjax.train.config import train_config
from tests.rl import test_loss_reference as reference
from tests.rl.learner_batches import rel_diff
from tests.train.test_configs import QUICKSTART, _load

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "learner.md"


def _files() -> dict[str, str]:
  """The doc's Python blocks by the file name on their first line ("# my_losses.py")."""
  blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
  return {m.group(1): b for b in blocks if (m := re.match(r"# (\S+\.py)\n", b))}


@pytest.fixture
def tutorial(tmp_path, monkeypatch):
  """The doc's files written to a directory on sys.path; their modules and losses gone again afterwards
  (other tests import modules of the same names)."""
  for name, text in _files().items():
    (tmp_path / name).write_text(text)
  monkeypatch.syspath_prepend(str(tmp_path))
  losses, modules = ("seq_pg", "reinforce_baseline"), ("my_losses", "my_baseline_loss", "check_my_loss")

  def forget():
    for name in losses:
      LOSSES.pop(name, None)
    for module in modules:
      sys.modules.pop(module, None)

  forget()
  yield tmp_path
  forget()


def test_the_tutorial_check_runs_as_written_and_its_options_are_checked(tutorial):
  assert {"my_losses.py", "check_my_loss.py", "my_baseline_loss.py"} <= set(_files())
  out = runpy.run_path(str(tutorial / "check_my_loss.py"))
  assert np.isfinite(out["loss"]) and out["metrics"]["grad_norm"] > 0 and 0 < out["metrics"]["seq_weight"] <= 2
  base = _load(QUICKSTART).get_config()
  cfg = train_config(base, ["plugins=my_losses", "learner.loss=seq_pg", "learner.loss_kwargs.c_seq=3"])
  assert LOSSES["seq_pg"].options_of(cfg.learner).c_seq == 3.0
  with pytest.raises(ConfigError, match=r"^config\.learner\.loss_kwargs\.c_sq: unknown field; did you mean c_seq\?$"):
    train_config(base, ["plugins=my_losses", "learner.loss=seq_pg", "learner.loss_kwargs.c_sq=2"])


def test_the_tutorial_loss_is_its_formula(tutorial):
  """L = -1/G sum_i w_i A_i mean_t log pi(y_i,t), w_i = min(exp(mean_t(log pi_old - log pi_rollout)), 2),
  over each rollout's unique trained tokens, in float64 from each path run alone."""
  runpy.run_path(str(tutorial / "my_losses.py"), run_name="my_losses")
  d, policy, old_policy = reference._path_data()
  learner = Learner(LearnerConfig(loss="seq_pg", logits_chunk=64), policy)
  batch = learner.prepare(d.batch)
  got, grads, _ = learner.loss_and_grads(batch, Learner(LearnerConfig(logits_chunk=64), old_policy).old_pass(batch))
  u = d.first
  mean = lambda v: reference._per_rollout_mean(d, v, u)
  w = np.minimum(np.exp(mean(d.lpo - d.lpr)), 2.0)
  rollouts = len(np.unique(d.rollout))
  per_token = -w * d.advantage * mean(d.lp) * u / np.bincount(d.rollout, u)[d.rollout] / rollouts
  assert abs(got - per_token.sum()) <= 1e-5 * np.abs(per_token).sum()
  dloss = -w * d.advantage * u / np.bincount(d.rollout, u)[d.rollout] / rollouts
  (want,) = d.vjp(jnp.asarray(d.cotangent(dloss), jnp.float32))
  assert rel_diff(grads["policy"], want) < 1e-5


def test_the_baseline_example_trains_its_critic(tutorial):
  runpy.run_path(str(tutorial / "my_baseline_loss.py"), run_name="my_baseline_loss")
  cfg = LearnerConfig(loss="reinforce_baseline", value=ValueConfig(kind="shared"), logits_chunk=64)
  learner = Learner(cfg, tiny_policy(), value=make_value_model("shared", TINY.d_model))
  _, _, metrics = learner.loss_and_grads(example_batch())
  assert metrics["value_grad_norm"] > 0 and metrics["grad_norm"] > 0 and metrics["value_loss"] > 0
