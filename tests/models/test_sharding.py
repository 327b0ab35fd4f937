"""Logical axis metadata: every parameter is named, a forward pass sharded over an 8-device mesh by
logical axis rules gives the single-device logits, and activation constraints map logical names onto the
mesh only under `sharding.under_mesh`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import spmd

from clawjax import sharding
from clawjax.models.config import preset
from clawjax.models.layers import constrain
from clawjax.models.model import Decoder

from tests.models.helpers import pack_row, random_tree, rel_err

LOGICAL = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "expert", None}
# "embed" shares "data" with "batch" (FSDP-style), which activation constraints must resolve.
RULES = (("batch", "data"), ("length", None), ("vocab", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"),
         ("mlp", "tensor"), ("expert", "expert"), ("embed", "data"), ("head_dim", None))


def test_every_param_has_logical_axes():
  model = nnx.eval_shape(lambda: Decoder(preset("test-tiny-moe"), rngs=nnx.Rngs(0)))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == var.ndim and set(axes) <= LOGICAL, path


def test_sharded_forward_matches_single_device():
  cfg = preset("test-tiny-moe", attention_impl="blocked", attention_block=16)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  rows = [pack_row([random_tree(rng, cfg.vocab_size), random_tree(rng, cfg.vocab_size)], 48) for _ in range(4)]
  inputs = [jnp.asarray(np.stack([r[k] for r in rows])) for k in ("tokens", "positions", "segment_ids", "subtree_end")]
  forward = nnx.jit(lambda m, *args: m(*args))
  expected = forward(model, *inputs)

  # Auto (GSPMD) axes: the model annotates logical shardings, XLA propagates the rest.
  mesh = jax.make_mesh((2, 2, 2), ("data", "tensor", "expert"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), spmd.logical_axis_rules(RULES):
    graphdef, state = nnx.split(model)
    specs = nnx.get_partition_spec(state)
    state = jax.device_put(state, jax.tree.map(lambda s: jax.NamedSharding(mesh, s), specs))
    sharded = nnx.merge(graphdef, state)
    assert sharded.layers[0].mlp.gate[...].sharding.spec == jax.P("expert", "data", "tensor")
    batch = jax.NamedSharding(mesh, jax.P("data"))
    got = forward(sharded, *(jax.device_put(x, batch) for x in inputs))
  assert rel_err(got, expected) < 1e-5


def test_constrain_maps_logical_names_only_under_mesh():
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))

  def fn(x_BTNH, y_BTD):
    heads = ("batch", "length", "heads", "head_dim")
    # 3 heads do not split over 2 tensor shards; "embed" loses "fsdp" to "batch".
    return (constrain(x_BTNH, heads), constrain(x_BTNH[:, :, :3], heads),
            constrain(y_BTD, ("batch", "length", "embed")))

  args = (jnp.zeros((4, 8, 6, 16)), jnp.zeros((4, 8, 64)))
  text = jax.jit(sharding.under_mesh(fn, mesh)).lower(*args).as_text()
  assert '[{"data", "fsdp"}, {}, {"tensor"}, {}]> : tensor<4x8x6x16xf32>' in text
  assert '[{"data", "fsdp"}, {}, {}, {}]> : tensor<4x8x3x16xf32>' in text
  assert '[{"data", "fsdp"}, {}, {}]> : tensor<4x8x64xf32>' in text
  assert "sharding_constraint" not in jax.jit(fn).lower(*args).as_text()
  with pytest.raises(ValueError, match="'hedas' has no sharding rule"):
    jax.jit(sharding.under_mesh(lambda x: constrain(x, ("batch", "hedas")), mesh)).lower(jnp.zeros((4, 6)))
