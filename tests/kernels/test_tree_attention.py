"""Tree attention's references: the mask rule against a float64 brute force, blocked == dense (values and
gradients), blocked's block skipping and memory."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.kernels import tree_attention as attention
from clawjax.kernels.tree_attention import reference

from tests.models.helpers import pack_row, random_tree, rel_err


def packed_rows(seed: int, length: int, vocab: int, trees_per_row=(2, 3)):
  rng = np.random.default_rng(seed)
  rows, trees = [], []
  for n in trees_per_row:
    row_trees = [random_tree(rng, vocab) for _ in range(n)]
    while sum(len(t.tokens) for t in row_trees) > length:
      row_trees.pop()
    rows.append(pack_row(row_trees, length))
    trees.append(row_trees)
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}, trees


def brute_force_attention(q, k, v, segment_ids, subtree_end):
  """float64 loops over the rule in clawjax/tree/batch.py."""
  b, t, n, h = q.shape
  group = n // k.shape[2]
  out = np.zeros((b, t, n, h))
  for bi in range(b):
    for i in range(t):
      keys = [j for j in range(t) if segment_ids[bi, i] == segment_ids[bi, j] > 0 and j <= i < subtree_end[bi, j]]
      for head in range(n):
        if not keys:
          continue
        s = np.array([q[bi, i, head] @ k[bi, j, head // group] for j in keys], np.float64) / np.sqrt(h)
        p = np.exp(s - s.max())
        out[bi, i, head] = (p / p.sum()) @ v[bi, keys, head // group]
  return out


def random_qkv(seed, b, t, n=4, kv=2, h=8):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (b, t, n, h)), jax.random.normal(keys[1], (b, t, kv, h)),
          jax.random.normal(keys[2], (b, t, kv, h)))


@pytest.mark.parametrize("impl,block", [("dense", 0), ("blocked", 4), ("blocked", 16)])
def test_kernels_match_brute_force(impl, block):
  rows, _ = packed_rows(0, 37, vocab=50)
  q, k, v = random_qkv(1, 2, 37)
  kernel = jax.jit(functools.partial(attention.KERNELS[impl], block=block))
  out = kernel(q, k, v, jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["subtree_end"]))
  ref = brute_force_attention(*(np.asarray(x, np.float64) for x in (q, k, v)), rows["segment_ids"], rows["subtree_end"])
  assert rel_err(out, ref) < 1e-5


def test_blocked_gradients_match_dense():
  rows, _ = packed_rows(2, 45, vocab=50, trees_per_row=(3, 4))
  q, k, v = random_qkv(3, 2, 45)
  cotangent = jax.random.normal(jax.random.key(4), q.shape)
  seg, end = jnp.asarray(rows["segment_ids"]), jnp.asarray(rows["subtree_end"])

  def loss(impl, q, k, v):
    return jnp.sum(attention.KERNELS[impl](q, k, v, seg, end, block=8) * cotangent)

  dense = jax.jit(jax.grad(lambda *a: loss("dense", *a), argnums=(0, 1, 2)))(q, k, v)
  blocked = jax.jit(jax.grad(lambda *a: loss("blocked", *a), argnums=(0, 1, 2)))(q, k, v)
  for d, b in zip(dense, blocked):
    assert rel_err(b, d) < 1e-5


def test_blocked_skips_invisible_blocks():
  """Only the diagonal block of each single-token-subtree row is needed: the cond must skip the rest."""
  t, block = 32, 8
  seg = jnp.ones((1, t), jnp.int32)
  end = jnp.arange(1, t + 1, dtype=jnp.int32)[None]  # every token sees only itself
  def is_needed(qs, ks):
    return bool(reference.block_needed(qs, seg[:, qs:qs + block], ks, seg[:, ks:ks + block],
                                       end[:, ks:ks + block], block))

  table = [[is_needed(qs, ks) for ks in range(0, t, block)] for qs in range(0, t, block)]
  assert table == [[i == j for j in range(4)] for i in range(4)]


def test_negative_segment_ids_are_padding_to_every_implementation():
  """One rule for segment ids (mask.py): an id <= 0 is padding to dense, blocked and the block-sparse Pallas
  kernel (interpret mode) alike, as to the float64 brute force: it sees nothing and nothing sees it."""
  t = 48
  rows, _ = packed_rows(6, t, vocab=50, trees_per_row=(3, 4))
  seg, end = rows["segment_ids"].copy(), rows["subtree_end"]
  seg[0][seg[0] == 2] = -2  # a whole tree of row 0 under a negative id
  seg[1, 5:9] = -1          # a stretch inside a tree of row 1
  assert (seg[0] == -2).any() and (seg[1] > 0).any()
  q, k, v = random_qkv(7, 2, t)
  ref = brute_force_attention(*(np.asarray(x, np.float64) for x in (q, k, v)), seg, end)
  assert not ref[seg <= 0].any() and ref[seg > 0].any()
  for impl, block in (("dense", 0), ("blocked", 8), ("pallas", 16)):
    out = jax.jit(functools.partial(attention.KERNELS[impl], block=block))(q, k, v, jnp.asarray(seg), jnp.asarray(end))
    assert rel_err(out, ref) < 1e-5, impl


def test_blocked_memory_is_linear_in_length():
  """Compile-only (XLA's buffer analysis): fwd+bwd scratch memory of the blocked kernel at T=16K stays far
  below one [N, T, T] float32 score tensor, which the dense kernel needs."""
  b, t, n, kv, h, block = 1, 16_384, 4, 2, 32, 512
  q = jax.ShapeDtypeStruct((b, t, n, h), jnp.float32)
  k = jax.ShapeDtypeStruct((b, t, kv, h), jnp.float32)
  ids = jax.ShapeDtypeStruct((b, t), jnp.int32)

  def loss(q, k, v, seg, end):
    return jnp.sum(reference.blocked_attention(q, k, v, seg, end, block=block))

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, k, ids, ids).compile()
  scratch = compiled.memory_analysis().temp_size_in_bytes
  assert scratch < 0.05 * (b * n * t * t * 4), scratch
