"""Training with the embedded engine on devices of its own (engine.options.devices = 4 of the 8 simulated
CPU devices): the learner trains on the other four, each push moves the weights device to device (nothing
is exported), and the next step's rollouts sample exactly the learner's weights."""
from __future__ import annotations

import dataclasses

import jax
import pytest

from clawjax.harness import adapters
from clawjax.train.metrics import read_metrics
from clawjax.train.trainer import Trainer
from tests.train.test_e2e import CrashingHarness, _config, _task_dir


@pytest.mark.slow
def test_learner_and_engine_on_disjoint_devices(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "crash", CrashingHarness())  # (in the base config; not run here)
  base = _config(_task_dir(tmp_path), steps=2)
  cfg = dataclasses.replace(base, harnesses=("mini",), eval_every=0, plot=False,
                            engine=dataclasses.replace(base.engine, options={**base.engine.options, "devices": 4}))
  trainer = Trainer(cfg, tmp_path / "run")
  assert list(trainer.mesh.devices.flat) == jax.devices()[:4]
  trainer.run()
  rows = read_metrics(tmp_path / "run", "rl")
  assert [r["policy_version"] for r in rows] == [1, 2]
  # Step 2 sampled the weights step 1 pushed: the learner's pi_old equals the engine's log-probs.
  assert rows[1]["max_abs_logp_old_minus_rollout"] < 1e-3 and rows[1]["tis_truncated_fraction"] == 0
  assert not (tmp_path / "run" / "export").exists()
