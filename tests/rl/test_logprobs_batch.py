"""Chunked log-probs vs float64 numpy, and the host-side batch compaction vs a brute-force loop."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.rl.device_batch import RowLayout, prepare_batch
from clawjax.rl.logprobs import token_logprobs
from clawjax.tree.batch import PackedBatch


def test_token_logprobs_and_gradient_match_float64():
  rng = np.random.default_rng(0)
  rows, k, d, v, temp = 2, 12, 8, 50, 0.7
  h = rng.normal(size=(rows, k, d))
  w = rng.normal(size=(d, v))
  t = rng.integers(0, v, (rows, k))
  logp, ent = token_logprobs(lambda x: x @ jnp.float32(w), jnp.float32(h), jnp.int32(t), temp, chunk=4)

  z = h @ w / temp
  z = z - z.max(-1, keepdims=True)
  lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  np.testing.assert_allclose(np.asarray(logp), np.take_along_axis(lp, t[..., None], -1)[..., 0], rtol=1e-5)
  np.testing.assert_allclose(np.asarray(ent), -(np.exp(lp) * lp).sum(-1), rtol=1e-5)
  # d log p(t) / d h = W (onehot(t) - p) / T
  grad = jax.grad(lambda hh: token_logprobs(lambda x: x @ jnp.float32(w), hh, jnp.int32(t), temp, 4)[0].sum())(
      jnp.float32(h))
  ref = (np.eye(v)[t] - np.exp(lp)) @ w.T / temp
  np.testing.assert_allclose(np.asarray(grad), ref, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="multiple of logits_chunk"):
    token_logprobs(lambda x: x @ jnp.float32(w), jnp.float32(h), jnp.int32(t), temp, chunk=5)


def _batch(rng, rows=3, length=20) -> PackedBatch:
  f = lambda: rng.random((rows, length)).astype(np.float32)
  weight = (rng.random((rows, length)) < 0.4).astype(np.float32)
  weight[:, 0] = 0
  parent = np.where(weight > 0, rng.integers(0, length, (rows, length)), -1).astype(np.int32)
  parent[:, 0] = -1
  ints = lambda: rng.integers(0, 100, (rows, length)).astype(np.int32)
  return PackedBatch(ints(), ints(), parent, ints(), ints(), weight, weight * 3, f(), f(), f(), f(), ints(),
                     ["a"], np.zeros(1, np.int32), np.zeros(1, np.float32))


def test_prepare_batch_compacts_loss_tokens():
  rng = np.random.default_rng(1)
  b = _batch(rng)
  out = prepare_batch(b, RowLayout((3,), micro_batches=2, local_shards=2), aggregation="paths", chunk=4)
  rows = 4  # 3 padded up to a whole number per micro-batch and row shard
  assert out.tokens.shape == (2, rows // 2, 20)
  flat = lambda x: np.asarray(x).reshape(rows, -1)
  source = np.asarray(out.row_order).reshape(rows)  # one process: the batch row in each slot
  assert sorted(source) == [-1, 0, 1, 2]
  for slot, r in enumerate(source):
    got = [(int(flat(out.pred_index)[slot, s]), int(flat(out.targets)[slot, s]), float(flat(out.weight)[slot, s]),
            float(flat(out.advantages)[slot, s]))
           for s in range(flat(out.weight).shape[1]) if flat(out.weight)[slot, s] > 0]
    want = [] if r < 0 else [(int(b.parent_index_RT[r, i]), int(b.tokens_RT[r, i]), float(b.path_weight_RT[r, i]),
                              float(b.advantages_RT[r, i])) for i in range(20) if b.unique_weight_RT[r, i] > 0]
    assert got == want
  assert flat(out.weight).shape[1] % 4 == 0
  pad = int(np.flatnonzero(source < 0)[0])
  assert not flat(out.segment_ids)[pad].any()  # the padding row is empty
  np.testing.assert_array_equal(flat(out.subtree_end)[pad], np.arange(1, 21))


def test_prepare_batch_rejects_unpredicted_loss_token():
  b = _batch(np.random.default_rng(2))
  r, i = np.argwhere(b.unique_weight_RT > 0)[0]
  b.parent_index_RT[r, i] = -1
  with pytest.raises(ValueError, match=f"row {r}, position {i}"):
    prepare_batch(b, RowLayout((b.shape[0],)), aggregation="token")
