"""The engine's one-row copy: each dense Linear as [outputs, inputs], split over the engine's devices so
that each holds the rows of its model-layout shard, read by dispatches of one row only; the tokens and
log-probs a request gets do not depend on which layout its dispatches read."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.engine.kv_forward import KVRunner
from clawjax.generation import SamplingParams
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from clawjax.sharding import key_name
from tests.engine.conftest import SMALL, learner_logprobs, prompt


def _outputs_by_inputs(w, path) -> np.ndarray:
  """The reference: a model-layout Linear [inputs..., outputs...] as [outputs, inputs], in numpy."""
  inputs = 2 if path[-1] == "o_proj" else 1
  w = np.asarray(w)
  return w.reshape(int(np.prod(w.shape[:inputs])), -1).T


def _copies(model, devices, setting="on"):
  """The runner, and by param name (("layers", 0, "attn", "q_proj")): the model's leaves, the engine's
  leaves, and the one-row copy."""
  runner = KVRunner(model, dataclasses.replace(SMALL, devices=len(devices), one_row_copy=setting), devices)
  state = nnx.state(model)
  names = [tuple(key_name(k) for k in p)[:-1] for p, _ in jax.tree.flatten_with_path(state)[0]]
  leaves, one_row = runner.weights(state)
  copy = {names[i]: w for i, w in zip(runner.programs.linears, one_row)}
  return runner, dict(zip(names, jax.tree.leaves(state))), dict(zip(names, leaves)), copy


@pytest.mark.parametrize("name", ["test-tiny-vocab", "test-tiny-moe"])
def test_the_copy_holds_each_dense_linear_outputs_by_inputs(name):
  model = Decoder(preset(name), rngs=nnx.Rngs(3))
  cfg = model.cfg
  runner, ours, leaves, copy = _copies(model, jax.devices()[:1])
  for path, w in leaves.items():  # the model's layout, unchanged
    np.testing.assert_array_equal(np.asarray(w), np.asarray(ours[path]))
  d, n, kv, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
  expect = {("attn", "q_proj"): (n * h, d), ("attn", "k_proj"): (kv * h, d), ("attn", "v_proj"): (kv * h, d),
            ("attn", "o_proj"): (d, n * h)}
  if name == "test-tiny-vocab":  # a dense MLP
    expect |= {("mlp", "gate"): (cfg.mlp_dim, d), ("mlp", "up"): (cfg.mlp_dim, d), ("mlp", "down"): (d, cfg.mlp_dim)}
  want = {(("layers", i) + part): shape for i in range(cfg.n_layers) for part, shape in expect.items()}
  want[("lm_head",)] = (cfg.vocab_size, d)  # both untied
  assert {path: w.shape for path, w in copy.items()} == want  # a MoE layer's router and experts: none
  for path, w in copy.items():
    np.testing.assert_array_equal(np.asarray(w), _outputs_by_inputs(ours[path], path))
  abstract_leaves, abstract_copy = runner.abstract_weights()
  assert [a.shape for a in abstract_leaves] == [w.shape for w in leaves.values()]
  assert [a.shape for a in abstract_copy] == [w.shape for w in copy.values()]


def test_each_device_keeps_the_rows_of_its_model_layout_shard():
  """Tensor parallel over 4 devices: heads (q: 4 of them), the MLP and the vocabulary split. A device's
  copy holds exactly the outputs its model-layout shard computes."""
  model = Decoder(preset("test-tiny-vocab"), rngs=nnx.Rngs(4))
  _, _, leaves, copy = _copies(model, jax.devices()[:4])
  for path in (("layers", 0, "attn", "q_proj"), ("layers", 1, "mlp", "gate"), ("layers", 1, "mlp", "down"),
               ("layers", 0, "attn", "o_proj"), ("lm_head",)):
    assert not copy[path].sharding.is_fully_replicated, path
    by_device = {s.device: s.data for s in leaves[path].addressable_shards}
    for shard in copy[path].addressable_shards:
      np.testing.assert_array_equal(np.asarray(shard.data), _outputs_by_inputs(by_device[shard.device], path))


def test_no_copy_when_off_and_auto_is_on_for_cpu():
  model = Decoder(preset("test-tiny-vocab"), rngs=nnx.Rngs(4))
  assert _copies(model, jax.devices()[:1], "off")[3] == {}
  assert len(_copies(model, jax.devices()[:1], "auto")[3]) == 7 * model.cfg.n_layers + 1
  with pytest.raises(ValueError, match="one_row_copy"):
    EngineConfig(one_row_copy="yes")


def _sample(model, setting, requests):
  eng = Engine(model, dataclasses.replace(SMALL, one_row_copy=setting))
  try:
    futures = [eng.submit(ids, s) for ids, s in requests]
    return [f.result(timeout=300) for f in futures]
  finally:
    eng.close()


@pytest.mark.parametrize("name", ["test-tiny-vocab", "test-tiny-moe"])
def test_a_request_alone_gets_what_it_gets_beside_others_and_what_the_learner_computes(name):
  """Alone, its decode dispatches read the one-row copy; beside a second request, the model's layout."""
  model = Decoder(preset(name), rngs=nnx.Rngs(6))
  ids, s = prompt(61, 30), SamplingParams(max_new_tokens=12, temperature=1.0, seed=61)
  alone, = _sample(model, "on", [(ids, s)])
  beside = _sample(model, "on", [(ids, s), (prompt(62, 20), SamplingParams(max_new_tokens=16, temperature=1.0,
                                                                               seed=62))])[0]
  without, = _sample(model, "off", [(ids, s)])
  assert alone.output_ids == beside.output_ids == without.output_ids and len(alone.output_ids) == 12
  np.testing.assert_allclose(alone.output_logprobs, without.output_logprobs, atol=1e-5)
  np.testing.assert_allclose(alone.output_logprobs, beside.output_logprobs, atol=1e-5)
  np.testing.assert_allclose(alone.output_logprobs, learner_logprobs(model, ids, alone.output_ids, 1.0), atol=1e-4)
