"""Activation sharding in the learner's jitted step on 8 simulated devices: the traced program carries the
model's logical constraints mapped onto the mesh, MoE experts are laid out over "expert", and the sharded
step equals the single-device step."""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from clawjax import sharding
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from tests.rl.learner_batches import TINY, make_policy, random_tree, rel_diff, tree_layout

TOL = 1e-5
TINY_MOE = PRESETS["test-tiny-moe"].replace(n_layers=1, vocab_size=256)
# sgd without clipping: the update is -lr * grad, so update differences are gradient differences.
CFG = LearnerConfig(optimizer="sgd", lr=0.1, grad_clip=None, logits_chunk=32, micro_batches=2)
CONSTRAINT = re.compile(r"sdy\.sharding_constraint %\S+ <@mesh, \[(.*?)\]> : tensor<([0-9x]+)x[a-z0-9]+>")


def _batch(seed: int):
  """4 rows of tree-packed rollouts. Advantages are kept away from 0 and of one sign, so the loss does not
  cancel to ~0 and a relative tolerance on it measures float32 rounding, not cancellation."""
  rng = np.random.default_rng(seed)
  trees = [random_tree(rng, 40, TINY.vocab_size) for _ in range(4)]
  trees = [dataclasses.replace(t, advantage=abs(t.advantage) + 0.5) for t in trees]
  return tree_layout(trees, rows=4, length=96)


def _constraints(text: str) -> set[tuple[tuple[int, ...], tuple[tuple[str, ...], ...]]]:
  """{(shape, mesh axes per dim)} of every sharding constraint in StableHLO (Shardy) text."""
  out = set()
  for dims, shape in CONSTRAINT.findall(text):
    axes = tuple(tuple(re.findall(r'"(\w+)"', d)) for d in re.findall(r"\{[^}]*\}", dims))
    out.add((tuple(int(s) for s in shape.split("x")), axes))
  return out


def _assert_step_matches_single_device(cfg: LearnerConfig, make, mesh, batch) -> Learner:
  sharded, single = Learner(cfg, make(), mesh=mesh), Learner(cfg, make())
  before = jax.device_get(single.state.params)
  m_sh, m_1 = sharded.step(batch), single.step(batch)
  assert m_sh["loss"] == pytest.approx(m_1["loss"], rel=TOL)
  assert m_sh["grad_norm"] == pytest.approx(m_1["grad_norm"], rel=TOL)
  after_sh, after_1 = jax.device_get(sharded.state.params), jax.device_get(single.state.params)
  assert rel_diff(after_sh, after_1) < TOL
  updates = lambda after: jax.tree.map(lambda a, b: a - b, after, before)
  assert rel_diff(updates(after_sh), updates(after_1)) < TOL  # = the gradients (plain sgd)
  return sharded


def test_step_traces_activation_constraints_and_matches_single_device():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  batch = _batch(0)
  learner = Learner(CFG, make_policy(), mesh=mesh)
  device_batch = learner.prepare(batch)
  text = learner._train.lower(learner.state, device_batch, learner.rest).as_text()
  r, t = device_batch.tokens.shape[1:]  # one micro-batch: [rows, length]
  slots = CFG.logits_chunk
  d, n, kv, h, f, v = TINY.d_model, TINY.n_heads, TINY.n_kv_heads, TINY.head_dim, TINY.mlp_dim, TINY.vocab_size
  batch_axes = ("data", "fsdp")  # "batch" -> BATCH_AXES; "embed" loses "fsdp" to it in activations
  expected = {
      ((r, t, d), (batch_axes, (), ())),                      # residual stream ("batch", "length", "embed")
      ((r, t, n, h), (batch_axes, (), ("tensor",), ())),      # queries over "heads"
      ((r, t, kv, h), (batch_axes, (), ("tensor",), ())),     # keys over "kv_heads"
      ((r, t, f), (batch_axes, (), ("tensor",))),             # SwiGLU hidden over "mlp"
      ((r, slots, v), (batch_axes, (), ("tensor",))),         # logits chunk over "vocab"
      ((v, d), (("tensor",), ())),                            # embedding table, FSDP-gathered
  }
  assert expected <= _constraints(text), sorted(_constraints(text))

  # Control: the same model traced without the learner's contexts has no constraints at all.
  plain = nnx.jit(lambda m, x: m(*x)).lower(make_policy(), (device_batch.tokens[0], device_batch.positions[0],
                                                             device_batch.segment_ids[0], device_batch.subtree_end[0]))
  assert not _constraints(plain.as_text())

  _assert_step_matches_single_device(CFG, make_policy, mesh, batch)


def test_moe_experts_shard_over_expert_axis_and_step_matches_single_device():
  assert TINY_MOE.is_moe_layer(0)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, tensor=2, expert=2))
  make = lambda: Decoder(TINY_MOE, rngs=nnx.Rngs(0))
  learner = _assert_step_matches_single_device(CFG, make, mesh, _batch(1))
  # The block runs per shard over every mesh axis (tokens over data, experts, MLP slices).
  text = learner._train.lower(learner.state, learner.prepare(_batch(1)), learner.rest).as_text()
  manual = re.findall(r"sdy\.manual_computation.*manual_axes=\{([^}]*)\}", text)
  assert any({"data", "tensor", "expert"} <= set(re.findall(r'"(\w+)"', m)) for m in manual), manual
  moe = learner.state.params["policy"]["layers"][0]["mlp"]
  # [E, D, F] and [E, F, D]: experts over "expert", the expert MLP tensor-parallel over "mlp"; "embed" is
  # unsplit (fsdp = 1); the router is replicated over experts.
  for name, spec in (("gate", P("expert", None, "tensor")), ("up", P("expert", None, "tensor")),
                     ("down", P("expert", "tensor", None)), ("router", P(None, None))):
    value = moe[name].value
    assert value.sharding.spec == spec, name
    assert value.addressable_shards[0].data.shape == tuple(
        dim // (mesh.shape[axis] if axis else 1) for dim, axis in zip(value.shape, spec)), name


def test_blocked_attention_runs_per_shard_and_step_matches_single_device():
  """Under the mesh the blocked kernel runs on each device's own rows (a manual computation over the
  batch axes, heads over "tensor"): which key blocks to skip is decided per device, with no collective
  in the block loop, so a device holding only padding rows skips all of them. One row of four is real
  here, as when a step has fewer rows than data-parallel devices."""
  blocked = TINY.replace(attention_impl="blocked", attention_block=32)
  make = lambda: Decoder(blocked, rngs=nnx.Rngs(0))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  rng = np.random.default_rng(2)
  trees = [dataclasses.replace(t, advantage=abs(t.advantage) + 0.5) for t in [random_tree(rng, 40, TINY.vocab_size)]]
  batch = tree_layout(trees, rows=4, length=96)
  learner = Learner(CFG, make(), mesh=mesh)
  text = learner._train.lower(learner.state, learner.prepare(batch), learner.rest).as_text()
  manual = re.findall(r"sdy\.manual_computation.*manual_axes=\{([^}]*)\}", text)
  assert manual and all({"data", "fsdp", "tensor"} <= set(re.findall(r'"(\w+)"', m)) for m in manual), manual
  _assert_step_matches_single_device(CFG, make, mesh, batch)


def test_moe_step_on_an_fsdp_and_expert_mesh_matches_single_device():
  """Rows over fsdp, the experts' "embed" dim FSDP-split (gathered inside the per-shard block), experts
  over "expert"."""
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=4, expert=2))
  make = lambda: Decoder(TINY_MOE, rngs=nnx.Rngs(0))
  learner = _assert_step_matches_single_device(CFG, make, mesh, _batch(1))
  assert learner.state.params["policy"]["layers"][0]["mlp"]["gate"].value.sharding.spec == P("expert", "fsdp", None)
