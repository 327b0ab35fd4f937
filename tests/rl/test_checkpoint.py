"""Orbax checkpoints: a run resumed from disk (into a fresh learner) takes a bitwise-identical next step."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from clawjax import sharding
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from tests.rl.learner_batches import TINY, make_policy, random_tree, tree_layout


def _leaves(state):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


@pytest.mark.slow  # ~30 s on 2 busy cores: an 8-device compile plus Orbax's first save
def test_resume_is_bitwise_identical(tmp_path):
  rng = np.random.default_rng(0)
  batches = [tree_layout([random_tree(rng, 40, TINY.vocab_size) for _ in range(4)], rows=4, length=96)
             for _ in range(2)]
  # KL and a shared critic put every part of the state (ref params, value params) in the checkpoint.
  cfg = LearnerConfig(loss="ppo", lr=1e-3, kl_coef=0.1, logits_chunk=32, value=ValueConfig(kind="shared"))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  make = lambda seed: Learner(cfg, make_policy(seed), value=make_value_model("shared", TINY.d_model), mesh=mesh)

  run = make(0)
  run.step(batches[0])
  ckpt = Checkpointer(tmp_path / "ckpt")
  assert ckpt.save(run.state, cursor={"next_batch": 1, "files": ["a.jsonl"]}) == 1
  expected = run.step(batches[1])
  expected_state = _leaves(run.state)

  # Restore into the state of a differently initialised learner: everything must come from disk. The
  # step runs on `run`'s already compiled function (the step depends only on config and model graph).
  fresh = make(seed=123).state
  run.state, cursor = Checkpointer(tmp_path / "ckpt").restore(fresh)
  assert cursor == {"next_batch": 1, "files": ["a.jsonl"]}
  assert int(run.state.step) == 1
  emb = run.state.params["policy"]["embedding"].value
  assert emb.sharding == fresh.params["policy"]["embedding"].value.sharding and not emb.sharding.is_fully_replicated
  got = run.step(batches[cursor["next_batch"]])
  assert got["loss"] == expected["loss"]
  got_state = _leaves(run.state)
  assert len(got_state) == len(expected_state)
  assert all(np.array_equal(a, b) for a, b in zip(got_state, expected_state))


def test_restore_without_checkpoint_names_directory(tmp_path):
  learner = Learner(LearnerConfig(), make_policy())
  with pytest.raises(FileNotFoundError, match="empty"):
    Checkpointer(tmp_path / "empty").restore(learner.state)
