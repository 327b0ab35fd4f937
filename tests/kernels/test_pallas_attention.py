"""The Pallas tree-attention kernel: its block table against the mask, forward and gradients == dense on
random trees (interpret mode on CPU, f32 and bf16), per shard under a mesh, and compiled for a TPU
topology (Mosaic) from this CPU host."""
import functools
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.kernels.tree_attention import KERNELS, block_sparse
from clawjax.kernels.tree_attention.mask import tree_mask
from clawjax.kernels.tree_attention.reference import dense_attention
from clawjax.models.attention import per_shard
from clawjax.models.config import preset
from clawjax.models.model import Decoder

from tests.models.helpers import forward, rel_err
from tests.kernels.test_tree_attention import packed_rows, random_qkv


def tree_rows(seed: int, length: int, trees_per_row=(4, 6)) -> tuple[jax.Array, jax.Array]:
  """Rows of random trees (shared prefixes, several segments, end padding) and one all-padding row."""
  rows, _ = packed_rows(seed, length, vocab=50, trees_per_row=trees_per_row)
  seg = np.concatenate([rows["segment_ids"], np.zeros((1, length), np.int32)])
  end = np.concatenate([rows["subtree_end"], np.zeros((1, length), np.int32)])
  return jnp.asarray(seg), jnp.asarray(end)


def test_kernel_is_a_pallas_call():
  seg, end = tree_rows(0, 40)
  q, k, v = random_qkv(0, 3, 40)
  jaxpr = jax.make_jaxpr(functools.partial(KERNELS["pallas"], block=16))(q, k, v, seg, end)
  assert "pallas_call" in str(jaxpr)


def test_block_table_is_the_mask_per_block():
  """Visible blocks are exactly the (query block, key block) pairs holding a visible pair; the compacted
  lists walk them in order and then repeat the last one."""
  block, t = 8, 64
  seg, end = tree_rows(1, t)
  mask_BTT = np.asarray(tree_mask(jnp.broadcast_to(jnp.arange(t), seg.shape), seg, seg, end))
  nb = t // block
  expected = mask_BTT.reshape(-1, nb, block, nb, block).any(axis=(2, 4))
  table = np.asarray(block_sparse.block_table(seg, end, block))
  np.testing.assert_array_equal(table, expected)
  assert 0 < table.sum() < table.size / 2  # the trees leave most blocks invisible
  lists, counts = (np.asarray(x) for x in block_sparse.compact(jnp.asarray(table)))
  for r in range(table.shape[0]):
    for qi in range(nb):
      visible = np.flatnonzero(table[r, qi])
      assert counts[r, qi] == len(visible)
      assert list(lists[r, qi, :len(visible)]) == list(visible)
      assert set(lists[r, qi, len(visible):]) <= {visible[-1] if len(visible) else 0}


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_forward_and_gradients_match_dense(dtype, tol):
  """T = 150 with block 32 (padded inside to 160), GQA 4/2 heads, one padding row: values and all three
  gradients against dense in f32 on the same (rounded) inputs; the padding row gives exactly 0."""
  t = 150
  seg, end = tree_rows(2, t)
  q, k, v = (x.astype(dtype) for x in random_qkv(3, seg.shape[0], t, n=4, kv=2, h=16))
  cotangent = jax.random.normal(jax.random.key(4), q.shape)

  def loss(kernel, q, k, v):
    return jnp.sum(kernel(q, k, v, seg, end).astype(jnp.float32) * cotangent)

  pallas = functools.partial(KERNELS["pallas"], block=32)
  dense = functools.partial(dense_attention, block=0)
  out = jax.jit(pallas)(q, k, v, seg, end)
  grads = jax.jit(jax.grad(functools.partial(loss, pallas), argnums=(0, 1, 2)))(q, k, v)
  f32 = [x.astype(jnp.float32) for x in (q, k, v)]
  ref = dense(*f32, seg, end)
  ref_grads = jax.grad(functools.partial(loss, dense), argnums=(0, 1, 2))(*f32)
  assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
  assert rel_err(out.astype(jnp.float32), ref) < tol
  for g, r in zip(grads, ref_grads):
    assert rel_err(g.astype(jnp.float32), r) < tol
  assert not np.any(np.asarray(out[-1])) and not any(np.any(np.asarray(g[-1])) for g in grads)


def test_per_shard_under_mesh_matches_dense():
  """Under the learner's mesh (rows over data, heads over tensor) each device runs the kernel on its own
  rows and heads, padding rows and all."""
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
  t = 48
  seg, end = tree_rows(5, t, trees_per_row=(2, 3, 4))  # 4 rows (the last all padding) over data x fsdp
  q, k, v = random_qkv(6, 4, t, n=4, kv=2, h=8)

  def loss(impl, q, k, v):
    kernel = KERNELS[impl]
    return jnp.sum(per_shard(kernel, q, k, v, seg, end, block=16) ** 2)

  fn = jax.jit(sharding.under_mesh(jax.value_and_grad(functools.partial(loss, "pallas"), argnums=(0, 1, 2)), mesh))
  # Placed on the mesh as the learner places its batches (a jit of single-device inputs is one partition).
  placed = [jax.device_put(x, jax.NamedSharding(mesh, jax.P(("data", "fsdp"), None, "tensor"))) for x in (q, k, v)]
  assert "shard_map" in str(jax.make_jaxpr(fn)(*placed))
  value, grads = fn(*placed)
  ref_value, ref_grads = jax.value_and_grad(functools.partial(loss, "dense"), argnums=(0, 1, 2))(q, k, v)
  assert rel_err(value, ref_value) < 1e-5
  for g, r in zip(grads, ref_grads):
    assert rel_err(g, r) < 1e-5


def test_decoder_with_pallas_equals_dense():
  cfg = preset("test-tiny-vocab", attention_impl="pallas", attention_block=16)
  rows, _ = packed_rows(7, 40, vocab=cfg.vocab_size)
  inputs = [jnp.asarray(rows[k]) for k in ("tokens", "positions", "segment_ids", "subtree_end")]
  logits = forward(Decoder(cfg, rngs=nnx.Rngs(0)), *inputs)
  ref = forward(Decoder(preset("test-tiny-vocab", attention_impl="dense"), rngs=nnx.Rngs(0)), *inputs)
  assert rel_err(logits, ref) < 1e-5


def test_compiles_for_tpu_under_the_learner_mesh(monkeypatch):
  """Mosaic, not the interpreter: forward and backward (bf16, block 128, rows over data, heads over
  tensor) compiled for a v5e 2x2 topology on this CPU host, each kernel a TPU custom call."""
  pytest.importorskip("libtpu", reason="libtpu is not installed (the `tpu` extra): no TPU compiler here")
  from jax.experimental import topologies
  # libtpu takes a machine-wide lock unless told otherwise; compile-only, other processes may hold it.
  monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  devices = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices
  mesh = sharding.make_mesh(sharding.MeshConfig(data=2, tensor=2), devices=devices)
  b, t, n, kv, h = 4, 2000, 8, 2, 128
  spec = lambda *axes: jax.sharding.NamedSharding(mesh, jax.P(*axes))
  args = (jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=spec("data", None, "tensor")),
          *[jax.ShapeDtypeStruct((b, t, kv, h), jnp.bfloat16, sharding=spec("data", None, "tensor"))] * 2,
          *[jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=spec("data"))] * 2)

  def loss(q, k, v, seg, end):
    o = per_shard(KERNELS["pallas"], q, k, v, seg, end, block=128)
    return jnp.sum(o.astype(jnp.float32) ** 2)

  fwd = jax.jit(sharding.under_mesh(lambda *a: per_shard(KERNELS["pallas"], *a, block=128), mesh))
  assert fwd.lower(*args).compile().as_text().count("tpu_custom_call") == 1
  grad = jax.jit(sharding.under_mesh(jax.grad(loss, argnums=(0, 1, 2)), mesh)).lower(*args).compile()
  assert grad.as_text().count("tpu_custom_call") == 3  # forward, dQ, dK/dV


def test_benchmark_reports_consistent_figures(monkeypatch):
  """benchmarks/tree_attention_kernels.py at toy size: the skip figures add up, and (with libtpu) both
  kernels compile for one TPU chip outside any mesh, the Pallas one as its three Mosaic kernels."""
  monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
  import tree_attention_kernels
  compile_args = ["--compile", "--compile-block", "128", "--heads", "2", "--kv-heads", "1"]
  has_libtpu = importlib.util.find_spec("libtpu") is not None
  if has_libtpu:
    monkeypatch.setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  out = tree_attention_kernels.main(
      ["--row-len", "2048", "--groups", "1", "--rollouts", "2", "--prompt-len", "200", "--calls", "6",
       "--tokens-per-call", "60", "--blocks", "64", "128"] + compile_args * has_libtpu)
  for skips in out["skips"]:
    assert sum(skips["visible_blocks_per_row"]) == skips["visible_blocks"] <= skips["causal_blocks"]
    assert 0 < skips["skipped_of_causal"] < skips["skipped_of_all"] < 1
    assert 0 < skips["attended_over_computed"] <= 1
  if has_libtpu:
    compiled = out["compiled"]
    assert compiled["pallas"]["kernel_calls"] == 3 and compiled["blocked"]["kernel_calls"] == 0
    assert (compiled["pallas"]["attention_lowering"], compiled["blocked"]["attention_lowering"]) == ("mosaic_tpu", "xla")
    assert compiled["blocked"]["needed_blocks"] >= compiled["visible_blocks"] > 0
    assert 0 < compiled["pallas"]["kernel_flops"] < compiled["blocked"]["analytic_flops"]


def test_benchmark_times_each_kernel_on_the_default_device(monkeypatch):
  """benchmarks/tree_attention_kernels.py's `time_kernels` (what a GPU device check runs) at toy size on
  this CPU: every kernel timed, with the lowering it got (here the Pallas interpreter) and its error
  against dense."""
  monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
  import tree_attention_kernels
  seg, end = tree_rows(8, 100)
  out = tree_attention_kernels.time_kernels(np.asarray(seg), np.asarray(end), heads=2, kv_heads=1, head_dim=16,
                                            block=32, repeats=2)
  assert out["platform"] == "cpu" and out["T"] == 100
  assert {impl: out[impl]["attention_lowering"] for impl in ("pallas", "blocked", "dense")} == {
      "pallas": "interpret", "blocked": "xla", "dense": "xla"}
  assert all(out[impl]["step_s"] > 0 and len(out[impl]["steps_s"]) == 2 for impl in ("pallas", "blocked", "dense"))
  for impl in ("pallas", "blocked"):  # bf16 inputs; each kernel against dense on this device
    assert out[impl]["rel_err_vs"] == "dense" and max(out[impl]["rel_err"].values()) < 2e-2
  assert out["pallas"]["kernel_block"] == 32 and out["pallas"]["visible_blocks"] > 0
  assert out["pallas"]["kernel_flops"] == block_sparse.pallas_attention_flops(out["pallas"]["visible_blocks"], 32, 16, 2)
