"""Mesh construction and logical-axis rules (8 simulated CPU devices from tests/conftest.py)."""
from __future__ import annotations

import jax
import pytest
from jax.sharding import PartitionSpec as P

from clawjax import sharding


def test_make_mesh_fills_one_axis():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=-1, tensor=2))
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2, "expert": 1}
  with pytest.raises(ValueError, match="product"):
    sharding.make_mesh(sharding.MeshConfig(data=3, fsdp=1))
  with pytest.raises(ValueError, match="at most one -1"):
    sharding.make_mesh(sharding.MeshConfig(data=-1, fsdp=-1))


def test_logical_rules_shard_divisible_dims_and_replicate_others():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2, expert=2))
  assert sharding.logical_to_mesh(("embed", "mlp"), (64, 128), mesh) == P("fsdp", "tensor")
  assert sharding.logical_to_mesh(("expert", "embed", "mlp"), (8, 64, 32), mesh) == P("expert", "fsdp", "tensor")
  # 9 heads do not split over 2 tensor shards (SmolLM2): replicated, not a lowering error.
  assert sharding.logical_to_mesh(("embed", "heads", "head_dim"), (576, 9, 64), mesh) == P("fsdp", None, None)
  # A mesh axis is used at most once per array.
  assert sharding.logical_to_mesh(("mlp", "vocab"), (64, 64), mesh) == P("tensor", None)
  with pytest.raises(ValueError, match="no sharding rule"):
    sharding.logical_to_mesh(("embd",), (64,), mesh)


def test_batch_sharding_splits_rows_over_data_and_fsdp():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  s = sharding.batch_sharding(mesh, 3, leading=1)
  assert s.spec == P(None, ("data", "fsdp"), None)
  assert sharding.batch_shards(mesh) == 4
  x = jax.device_put(jax.numpy.zeros((2, 8, 16)), s)
  assert x.addressable_shards[0].data.shape == (2, 2, 16)


def test_dcn_fields_are_checked_and_one_process_holds_every_row_shard():
  from clawjax.config import ConfigError
  with pytest.raises(ConfigError, match="config.mesh.dcn_fsdp"):
    sharding.MeshConfig(dcn_fsdp=0)
  with pytest.raises(ConfigError, match="config.mesh.dcn_granule"):
    sharding.MeshConfig(dcn_granule="pod")
  with pytest.raises(ValueError, match="dcn_data=4"):
    sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2, dcn_data=4))
  # One process is one granule: a mesh asking for data over 2 of them cannot be built here (the
  # 2-process test in tests/test_distributed.py builds it).
  with pytest.raises(ValueError, match="must equal the product"):
    sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2, dcn_data=2, dcn_granule="process"))
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  assert sharding.local_row_shards(mesh) == (0, 1, 2, 3) and sharding.batch_shards(mesh) == 4


def _bytes_on(tree, device) -> int:
  """Bytes of `tree`'s arrays held by `device`."""
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)


def test_adam_moments_are_sharded_like_their_parameters():
  """On a 4-way fsdp mesh every mu / nu leaf (of the policy's and the critic's optimizers, and of the critic's
  pretraining one) has its parameter's sharding, so a device holds 2 x its parameter bytes of optimizer
  state, not the whole moments (8 x here, where the parameters are split 4 ways)."""
  from flax import nnx

  from clawjax.models.model import Decoder
  from clawjax.rl.config import LearnerConfig, ValueConfig
  from clawjax.rl.learner import Learner
  from clawjax.rl.value import make_value_model
  from tests.rl.learner_batches import TINY, make_policy

  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=4), jax.devices()[:4])
  critic = make_value_model("separate", TINY.d_model, trunk=Decoder(TINY, rngs=nnx.Rngs(7)))
  cfg = LearnerConfig(optimizer="adamw", loss="ppo", value=ValueConfig(kind="separate"))
  learner = Learner(cfg, make_policy(), value=critic, mesh=mesh)
  state = learner.state
  moments = [(name, state.opt_state[name][1][0], state.params[name]) for name in ("policy", "value")]
  moments.append(("value pretraining", state.value_opt_state[1][0], state.params["value"]))
  for name, adam, params in moments:
    param_specs = jax.tree.map(lambda x: x.sharding.spec, params)
    assert any(spec != P() for spec in jax.tree.leaves(param_specs)), name  # fsdp splits the parameters
    for moment in (adam.mu, adam.nu):
      assert jax.tree.map(lambda x: x.sharding.spec, moment) == param_specs, name
  device = mesh.devices.flat[0]
  ratio = _bytes_on(state.opt_state["policy"], device) / _bytes_on(state.params["policy"], device)
  assert ratio == pytest.approx(2.0, rel=1e-3)  # mu + nu; the step counts are a few replicated scalars
