"""The policy session's weight push reaches the engine: its policy version bumps and it then samples
exactly what an engine built from the pushed weights samples; a learner update after the push (which
donates the learner's buffers) never touches the engine's copy."""
from __future__ import annotations

import numpy as np

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.generation import SamplingParams
from clawjax.models.loading import load_model
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.learner import Learner
from clawjax.run.session import PolicySession
from clawjax.tasks import bundled_tasks_dir
from clawjax.train.config import train_config
from clawjax.tree.pack import pack_trees

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)
PROMPT = [1, 504, 3270, 28, 17, 2]


def _config(tmp_path):
  return train_config({
      "tasks": str(bundled_tasks_dir()), "harnesses": ("mini",), "tensorboard": False,
      "model": {"init": "smollm2-135m", "random_init": True, "template": "smollm2",
                "overrides": dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)},
      "engine": {"options": {"max_slots": 2, "max_seq_len": 512}},
      "learner": {"lr": 1e-2, "logits_chunk": 16},
  })


def _policy(cfg, seed: int):
  return load_model(cfg.model.init, seed=seed, random_init=cfg.model.random_init, **cfg.model.overrides).model


def _sample(engine: Engine) -> tuple[tuple[int, ...], np.ndarray]:
  r = engine.submit(PROMPT, GREEDY).result()
  return r.output_ids, np.asarray(r.output_logprobs)


def test_push_bumps_version_and_changes_outputs(tmp_path):
  cfg = _config(tmp_path)
  learner = Learner(cfg.learner, _policy(cfg, seed=0))
  other = _policy(cfg, seed=1)
  reference = Engine(other, EngineConfig(max_slots=2, max_seq_len=64))
  try:
    want = _sample(reference)
  finally:
    reference.close()
  with PolicySession(cfg, tmp_path / "calls", policy=learner.policy_copy()) as server:
    before = _sample(server.engine)
    assert server.push(other, 1) == 1 and server.engine.version == 1
    after = _sample(server.engine)
    assert after[0] == want[0]
    np.testing.assert_allclose(after[1], want[1], rtol=1e-5, atol=1e-5)
    assert after[0] != before[0] or not np.allclose(after[1], before[1])

    assert server.push(learner.policy_copy(), 2) == 2
    again = _sample(server.engine)
    assert again[0] == before[0]
    empty = pack_trees([], grpo_advantages([]), row_len=64, rows=1)
    learner.step(learner.prepare(empty))  # donates the learner's old buffers
    assert _sample(server.engine)[0] == before[0]
