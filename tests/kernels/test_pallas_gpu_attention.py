"""The GPU (Triton) tree-attention kernel: forward and the three gradients against a float64 brute force
(Pallas interpret mode on CPU, f32 and bf16, GQA, padding rows, blocks no query sees filled with NaN),
and compiled for an H200 from this CPU host (each of its three kernels a Triton custom call)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.aot import lowering, topology
from clawjax.config import ConfigError
from clawjax.kernels.tree_attention import KERNELS, block_sparse
from clawjax.kernels.tree_attention.triton_gpu import gpu_attention, tile

from tests.models.helpers import rel_err
from tests.kernels.test_pallas_attention import tree_rows
from tests.kernels.test_tree_attention import random_qkv


def brute_force_vjp(q, k, v, seg, end, do):
  """float64 numpy: the output and the gradients of sum(o * do) with respect to q, k and v, from the mask
  rule (key j visible to query i iff seg[i] == seg[j] != 0 and j <= i < end[j]) and the softmax's
  derivative: dP = dO V^T, dS = P * (dP - rowsum(P * dP)), dQ = dS K / sqrt(h), dK = dS^T Q / sqrt(h)."""
  b, t, n, h = q.shape
  group = n // k.shape[2]
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & (j <= i) & (i < end[:, None, :])
  mask = mask[:, None]  # [B, 1, T, T]
  kh, vh = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # a query head's KV head
  s = np.einsum("bink,bjnk->bnij", q, kh) / np.sqrt(h)
  s = np.where(mask, s, -np.inf)
  p = np.exp(s - np.where(mask.any(-1, keepdims=True), s.max(-1, keepdims=True), 0))
  p = np.where(mask, p, 0)
  p = p / np.where(mask.any(-1, keepdims=True), p.sum(-1, keepdims=True), 1)
  o = np.einsum("bnij,bjnk->bink", p, vh)
  dp = np.einsum("bink,bjnk->bnij", do, vh)
  ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
  dq = np.einsum("bnij,bjnk->bink", ds, kh) / np.sqrt(h)
  dk = np.einsum("bnij,bink->bjnk", ds, q) / np.sqrt(h)
  dv = np.einsum("bnij,bink->bjnk", p, do)
  heads = lambda x: x.reshape(b, t, n // group, group, h).sum(axis=3)  # the group's heads share K, V
  return o, dq, heads(dk), heads(dv)


@pytest.mark.parametrize("dtype,tol,h", [(jnp.float32, 1e-5, 24), (jnp.bfloat16, 1e-2, 32)])
def test_forward_and_gradients_match_float64_brute_force(dtype, tol, h):
  """T = 150 with block 32 (padded inside to 160), GQA 6 query / 2 KV heads (head_dim 24 is padded to 32
  inside), rows of random trees and one all-padding row. q, k and v are NaN in every block that holds no
  real token: a kernel that loaded and multiplied one would give NaN; the outputs and gradients there
  must be exactly 0."""
  t, block = 150, 32
  seg, end = tree_rows(2, t)
  table = np.asarray(block_sparse.block_table(*(jnp.pad(x, ((0, 0), (0, -t % block))) for x in (seg, end)),
                                                  block))
  causal = np.tril(np.ones(table.shape[1:], bool))
  assert 0 < table.sum() < (table.shape[0] - 1) * causal.sum()  # several blocks; some causal ones invisible
  q, k, v = (x.astype(dtype) for x in random_qkv(3, seg.shape[0], t, n=6, kv=2, h=h))
  do = jax.random.normal(jax.random.key(4), q.shape)
  ref = brute_force_vjp(*(np.asarray(x, np.float64) for x in (q, k, v)), np.asarray(seg), np.asarray(end),
                        np.asarray(do, np.float64))

  padded = np.pad(np.asarray(seg), ((0, 0), (0, -t % block))).reshape(seg.shape[0], -1, block)
  empty_BT = jnp.asarray(np.repeat(~padded.any(axis=2), block, axis=1)[:, :t])  # blocks of padding only
  assert empty_BT[-1].all() and empty_BT[:-1].any()
  poison = lambda x: jnp.where(empty_BT[:, :, None, None], jnp.nan, x).astype(dtype)

  @jax.jit
  def forward_and_grads(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: gpu_attention(q, k, v, seg, end, block=block, interpret=True), q, k, v)
    return out, vjp(do.astype(dtype))

  out, grads = forward_and_grads(*(poison(x) for x in (q, k, v)))
  assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
  for ours, r in zip((out, *grads), ref):
    assert rel_err(ours.astype(jnp.float32), r) < tol
    assert not np.any(np.asarray(ours)[np.asarray(empty_BT)])


def test_tile_for_a_config_block():
  """The TPU default block (512) is 64 on a GPU; small or odd blocks round down to a power of two >= 16."""
  assert [tile(b) for b in (512, 128, 64, 48, 32, 16, 8)] == [64, 64, 64, 32, 32, 16, 16]
  assert tile(512, 128) == 128
  with pytest.raises(ValueError, match="block=48 must be a power of two"):
    gpu_attention(*random_qkv(0, 1, 64, h=16), jnp.ones((1, 64), jnp.int32), jnp.ones((1, 64), jnp.int32),
                  block=48, interpret=True)


def h200():
  """One compile-only H200 (XLA's CUDA compiler, the `gpu-aot` extra)."""
  try:
    return topology.devices(topology.parse("h200:1x1x1"))[0]
  except ConfigError as e:  # no CUDA plugin installed
    pytest.skip(str(e))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiles_for_h200_as_triton(head_dim):
  """`attention_impl="pallas"` lowered for a CUDA GPU is the Triton kernel, not the interpreter: forward
  and backward (bf16, the default block) compiled for an H200 from this CPU host, with groups of 8 query
  heads per KV head (Qwen3-30B-A3B's; Qwen3-8B's are 4) within the GPU's shared memory."""
  one = jax.sharding.SingleDeviceSharding(device := h200())
  b, t, n, kv = 1, 1000, 16, 2
  args = (jax.ShapeDtypeStruct((b, t, n, head_dim), jnp.bfloat16, sharding=one),
          *[jax.ShapeDtypeStruct((b, t, kv, head_dim), jnp.bfloat16, sharding=one)] * 2,
          *[jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=one)] * 2)

  def loss(*a):
    return jnp.sum(KERNELS["pallas"](*a, block=512).astype(jnp.float32) ** 2)

  with topology.lowering_for(device):
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
  text = compiled.as_text()
  assert text.count('custom_call_target="__gpu$xla.gpu.triton"') == 3  # forward, dQ, dK/dV
  assert lowering.attention_lowering([text]) == "triton"
