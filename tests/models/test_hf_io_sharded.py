"""Shard-by-shard loading: `hf_io.load(mesh=...)` equals the plain load bitwise, lays every param out by
the logical rules, reads from the safetensors files only the slices the devices need (Hub and
transformers-5 fused expert layouts), and hands its arrays to the Learner without a host round trip."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors import safe_open

from clawjax import sharding
from clawjax.models import hf_io
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner

from tests.models.helpers import save_fused

# Every rule splits something at these sizes: d 64 / fsdp, 4 heads and 2 kv heads / tensor, mlp 96 and
# moe_mlp 32 / tensor, 8 experts / expert, vocab 128 / tensor.
MESH = sharding.MeshConfig(data=1, fsdp=2, tensor=2, expert=2)
# Expected layout, written out by hand from the rules in clawjax/sharding.py (last path names -> spec).
EXPECTED = {
    ("embedding",): P("tensor", "fsdp"),
    ("lm_head",): P("fsdp", "tensor"),
    ("scale",): P("fsdp"),                       # attn_norm, mlp_norm, final_norm
    ("q_norm", "scale"): P(None), ("k_norm", "scale"): P(None),
    ("attn", "q_proj"): P("fsdp", "tensor", None), ("attn", "k_proj"): P("fsdp", "tensor", None),
    ("attn", "v_proj"): P("fsdp", "tensor", None), ("attn", "o_proj"): P("tensor", None, "fsdp"),
    ("router",): P("fsdp", None),
}
DENSE_MLP = {"gate": P("fsdp", "tensor"), "up": P("fsdp", "tensor"), "down": P("tensor", "fsdp")}
MOE_MLP = {"gate": P("expert", "fsdp", "tensor"), "up": P("expert", "fsdp", "tensor"),
           "down": P("expert", "tensor", "fsdp")}


def _expected_spec(path: tuple, is_moe: bool) -> P:
  if path[-2:-1] == ("mlp",) and path[-1] in DENSE_MLP:
    return (MOE_MLP if is_moe else DENSE_MLP)[path[-1]]
  for n in (2, 1):
    if tuple(path[-n:]) in EXPECTED:
      return EXPECTED[tuple(path[-n:])]
  raise AssertionError(f"no expected sharding for {path}")


def _hf_dir(save_tiny_hf, tmp_path, layout: str):
  # Untied (lm_head), layer 0 dense and layer 1 MoE.
  hf_dir, hf_model = save_tiny_hf("qwen3_moe", tie_word_embeddings=False, decoder_sparse_step=2)
  if layout == "hub":
    return hf_dir
  return save_fused(hf_dir, hf_model, tmp_path / "fused")


@pytest.mark.parametrize("layout", ["hub", "fused"])
def test_sharded_load_equals_plain_load_and_reads_only_shards(layout, save_tiny_hf, tmp_path, monkeypatch):
  hf_dir = _hf_dir(save_tiny_hf, tmp_path, layout)
  plain = hf_io.load(hf_dir)
  reads: list[tuple[str, tuple[int, ...], int]] = []
  real_read = hf_io._Tensors.read

  def counting_read(self, key, index):
    out = real_read(self, key, index)
    reads.append((key, out.shape, out.nbytes))
    return out

  monkeypatch.setattr(hf_io._Tensors, "read", counting_read)
  mesh = sharding.make_mesh(MESH)
  model = hf_io.load(hf_dir, mesh=mesh)

  ours = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  ref = dict(nnx.to_flat_state(nnx.state(plain, nnx.Param)))
  assert ours.keys() == ref.keys()
  for path, var in ours.items():
    np.testing.assert_array_equal(np.asarray(var[...]), np.asarray(ref[path][...]), err_msg=str(path))
    is_moe = model.cfg.is_moe_layer(path[1]) if path[0] == "layers" else False
    expected = NamedSharding(mesh, _expected_spec(path, is_moe))
    assert var[...].sharding.is_equivalent_to(expected, var.ndim), (path, var[...].sharding.spec)

  # Every stored element is read exactly once (replicas share a read), and no read of a split tensor
  # is the whole tensor: only the head_dim q/k norms are replicated on this mesh.
  f32 = np.dtype(np.float32).itemsize
  assert sum(nbytes for _, _, nbytes in reads) == sum(v.size * f32 for v in ref.values())
  with safe_open(next(hf_dir.glob("*.safetensors")), framework="np") as handle:
    sizes = {k: int(np.prod(handle.get_slice(k).get_shape())) * f32 for k in handle.keys()}
  for key, shape, nbytes in reads:
    if not key.endswith(("q_norm.weight", "k_norm.weight")):
      assert nbytes < sizes[key], (key, shape)
  if layout == "fused":  # one expert's quarter (F/2 x D/2) of gate or up, out of gate_up_proj [E, 2F, D]
    cfg = model.cfg
    assert {s for k, s, _ in reads if k.endswith("gate_up_proj")} == {(cfg.moe_mlp_dim // 2, cfg.d_model // 2)}


def test_learner_takes_sharded_params_without_host_copies(save_tiny_hf):
  hf_dir, _ = save_tiny_hf("qwen3_moe", tie_word_embeddings=False, decoder_sparse_step=2)
  mesh = sharding.make_mesh(MESH)
  model = hf_io.load(hf_dir, mesh=mesh)
  loaded = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  with jax.transfer_guard_device_to_host("disallow"):
    learner = Learner(LearnerConfig(), model, mesh=mesh)
  held = dict(nnx.to_flat_state(learner.state.params["policy"]))
  for path, var in loaded.items():
    got = held[path][...]
    assert got.sharding == var[...].sharding, path
    # The very same device buffers: no copy at all, through the host or otherwise.
    assert [s.data.unsafe_buffer_pointer() for s in got.addressable_shards] == \
        [s.data.unsafe_buffer_pointer() for s in var[...].addressable_shards], path
