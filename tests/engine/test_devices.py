"""Learner and engine on disjoint devices of one process (4 + 4 of the 8 simulated CPU devices): the engine
splits its weights over its own devices, and new weights move there from the learner's devices by
`jax.device_put`, versioned as any update."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.engine.engine import Engine, EngineError
from clawjax.engine.placement import learner_devices
from clawjax.generation import SamplingParams
from tests.engine.conftest import SMALL, learner_logprobs, prompt, tiny_model


def test_learner_keeps_the_devices_the_engine_does_not_take():
  devices = jax.devices()
  assert learner_devices(0) == devices
  assert learner_devices(4) == devices[:4]
  with pytest.raises(ValueError, match="devices=8"):
    learner_devices(8)


def test_weights_move_from_the_learners_devices_to_the_engines(model):
  learner_mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2), learner_devices(4))
  state = nnx.state(tiny_model(5))
  learner_state = jax.device_put(state, sharding.state_shardings(state, learner_mesh))
  eng = Engine(model, dataclasses.replace(SMALL, devices=4))
  try:
    weights = jax.tree.leaves(eng._weights)  # pylint: disable=protected-access
    assert eng.runner.devices == jax.devices()[4:]
    assert {d for w in weights for d in w.devices()} == set(jax.devices()[4:])
    assert any(not w.sharding.is_fully_replicated for w in weights)  # split over the engine's devices
    ids, s = prompt(60, 20), SamplingParams(max_new_tokens=10, temperature=1.0, seed=60)
    before = eng.submit(ids, s).result(timeout=300)
    np.testing.assert_allclose(before.output_logprobs, learner_logprobs(model, ids, before.output_ids, 1.0),
                               atol=1e-4)
    assert eng.update_params(learner_state, version=3) == 3
    jax.tree.map(lambda x: x.delete(), learner_state)  # the learner donates its arrays: the engine holds copies
    after = eng.submit(ids, s).result(timeout=300)
    assert after.policy_version == 3 and after.output_ids != before.output_ids
    np.testing.assert_allclose(after.output_logprobs, learner_logprobs(tiny_model(5), ids, after.output_ids, 1.0),
                               atol=1e-4)
    weights = jax.tree.leaves(eng._weights)  # pylint: disable=protected-access
    assert {d for w in weights for d in w.devices()} == set(jax.devices()[4:])
    assert eng.update_from_model(model) == 4  # unnamed: the next version
    with pytest.raises(EngineError, match="below"):
      eng.update_from_model(model, version=2)
  finally:
    eng.close()
