"""The MoE block under the learner's mesh (8 simulated CPU devices): it runs per shard, each device routing
only its own tokens over only its own experts and MLP slice, and its output and gradients equal the
unsharded block's on fsdp, expert and tensor meshes, also through a `lax.ragged_dot` that leaves NaN
outside its groups (an expert shard's other experts' pairs); its per-device FLOPs shrink with the batch
shards."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.models.config import PRESETS
from clawjax.models.moe import MoE
from tests.models.helpers import garbage_ragged_dot

CFG = PRESETS["test-tiny-moe"]  # 8 experts, top 2, d_model 64, moe_mlp_dim 32


def _loss_and_grads(mesh: jax.sharding.Mesh | None):
  """(jitted d/d(params, x) of sum(sin(MoE(x))) with the value, its arguments): on `mesh` with the learner's
  rules and layout (parameters by logical axes, rows over the batch axes), or plain without one."""
  graph, params = nnx.split(MoE(CFG, rngs=nnx.Rngs(0)))
  x_BTD = jax.random.normal(jax.random.key(1), (8, 8, CFG.d_model))

  def loss(params, x_BTD):
    y_BTD = nnx.merge(graph, params)(x_BTD)
    return jnp.sum(jnp.sin(y_BTD)), y_BTD

  fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  if mesh is None:
    return jax.jit(fn), (params, x_BTD)
  args = (jax.device_put(params, sharding.state_shardings(params, mesh)),
          jax.device_put(x_BTD, sharding.batch_sharding(mesh, 3)))
  return jax.jit(sharding.under_mesh(fn, mesh)), args


@pytest.mark.parametrize("mesh_cfg", [dict(data=2, fsdp=4), dict(data=1, fsdp=2, expert=4),
                                      dict(data=1, fsdp=2, tensor=2, expert=2)],
                         ids=["fsdp", "expert", "fsdp-tensor-expert"])
def test_sharded_moe_equals_unsharded(mesh_cfg, monkeypatch):
  monkeypatch.setattr(jax.lax, "ragged_dot", garbage_ragged_dot)
  fn, args = _loss_and_grads(None)
  expected = jax.device_get(fn(*args))
  mesh = sharding.make_mesh(sharding.MeshConfig(**mesh_cfg))
  fn, args = _loss_and_grads(mesh)
  assert "sdy.manual_computation" in fn.lower(*args).as_text()  # the per-shard path, not the plain one
  got = jax.device_get(fn(*args))
  # Output, then every gradient (each expert's weights, the router, the input tokens) leaf by leaf.
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.max(np.abs(b))))


def test_per_device_flops_shrink_with_the_batch_shards():
  """Compiled on 8 devices (rows over data x fsdp = 8 shards), a device does ~1/8 of the block's FLOPs
  (forward and backward); routing every token on every device, with only "embed" split over fsdp, did
  ~1/4."""

  def flops(mesh_cfg: dict, devices: int) -> float:
    mesh = sharding.make_mesh(sharding.MeshConfig(**mesh_cfg), jax.devices()[:devices])
    fn, args = _loss_and_grads(mesh)
    return fn.lower(*args).compile().cost_analysis()["flops"]

  whole, per_device = flops(dict(data=1), 1), flops(dict(data=2, fsdp=4), 8)
  assert per_device < 1.25 * whole / 8, (per_device, whole)
