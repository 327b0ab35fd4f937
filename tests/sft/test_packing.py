"""Packing: every conversation exactly once an epoch, rows within their length, padding under 10% on a
length-skewed set (one conversation a row wastes most of it); and a packed row is trained exactly as its
conversations alone: the loss of a packed batch equals the token mean of each conversation's own
causal forward pass (float64 numpy), so no token attends across conversations."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.calllog import CallRecord
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder, causal_inputs
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.sft.packing import pack, padding_fraction, plan_epoch
from clawjax.sft.render import conversation_tree

TINY = PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=128)


def _conversation(rng, rid: str, turns: int, prompt: int, turn_len: int):
  """A tree like a rendered conversation: context, then per turn an output and the next context."""
  calls, history = [], list(rng.integers(1, TINY.vocab_size, prompt))
  for k in range(turns):
    out = list(rng.integers(1, TINY.vocab_size, turn_len))
    calls.append(CallRecord(rid, rid, "sft", k, "ok", tuple(history), tuple(out), (0.0,) * len(out), "main",
                            "stop", "", 0.0, 0.0))
    history = history + out + list(rng.integers(1, TINY.vocab_size, 5))
  return conversation_tree(rid, calls, 1 << 20, "cut")[0]


def skewed_sizes(n: int, row_len: int, seed: int = 0) -> np.ndarray:
  """Lognormal lengths (median ~row_len / 12, a long tail to row_len): most short, a few near the limit."""
  rng = np.random.default_rng(seed)
  return np.clip(rng.lognormal(np.log(row_len / 12), 1.0, n), 16, row_len).astype(int)


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_an_epoch_places_every_tree_once_within_rows(rows):
  sizes = skewed_sizes(500, 2048)
  plans = plan_epoch(sizes, row_len=2048, rows=rows, pool_batches=4, seed=3, epoch=1)
  placed = [i for p in plans for i in p.trees]
  assert sorted(placed) == list(range(len(sizes)))
  for p in plans:
    assert max(p.rows_of) < rows
    fill = np.bincount(p.rows_of, weights=sizes[list(p.trees)])
    assert fill.max() <= 2048
  assert plans == plan_epoch(sizes, row_len=2048, rows=rows, pool_batches=4, seed=3, epoch=1)
  assert plans != plan_epoch(sizes, row_len=2048, rows=rows, pool_batches=4, seed=3, epoch=2)


def test_padding_stays_under_ten_percent_on_a_length_skewed_set():
  sizes = skewed_sizes(2000, 4096)
  plans = plan_epoch(sizes, row_len=4096, rows=8, pool_batches=8, seed=0, epoch=0)
  padding = 1 - sizes.sum() / (len(plans) * 8 * 4096)
  one_per_row = 1 - sizes.mean() / 4096
  assert padding < 0.10 < 0.5 < one_per_row


@pytest.mark.slow
def test_a_packed_batch_trains_each_conversation_as_if_alone():
  rng = np.random.default_rng(0)
  trees = [_conversation(rng, f"c{i}", turns=int(rng.integers(1, 4)), prompt=int(rng.integers(4, 30)),
                         turn_len=int(rng.integers(3, 12))) for i in range(7)]
  plans = plan_epoch([t.size for t in trees], row_len=128, rows=4, pool_batches=4, seed=0, epoch=0)
  assert len(plans) == 1 and len(set(plans[0].rows_of)) < len(trees)  # several conversations a row
  batch = pack(trees, plans[0], row_len=128, rows=range(4))
  assert 0 < padding_fraction(batch) < 0.5
  segments = {(r, s) for r, s in zip(*np.nonzero(batch.segment_ids_RT)) for s in [batch.segment_ids_RT[r, s]]}
  assert len(segments) == len(trees)
  # One process's share (rows 3 and 1, and a padding row 5): those rows of the whole batch, in that order.
  share = pack(trees, plans[0], row_len=128, rows=[3, 1, 5])
  for name in ("tokens_RT", "positions_RT", "segment_ids_RT", "subtree_end_RT", "unique_weight_RT"):
    np.testing.assert_array_equal(getattr(share, name)[:2], getattr(batch, name)[[3, 1]], err_msg=name)
  assert share.shape == (3, 128) and not share.segment_ids_RT[2].any() and not share.unique_weight_RT[2].any()

  model = Decoder(TINY, rngs=nnx.Rngs(0))
  learner = Learner(LearnerConfig(loss="sft", logits_chunk=16), model)
  loss, _, _ = learner.loss_and_grads(batch)
  assert learner.loss(batch)["loss"] == loss  # the forward-only loss (held-out) is the same number
  nll, count = 0.0, 0
  for t in trees:  # each conversation alone, a plain causal pass
    logits = np.asarray(model(*causal_inputs(jnp.asarray(t.tokens_T[None]))), np.float64)[0]
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    logp = np.take_along_axis(logits[:-1], t.tokens_T[1:, None], -1)[:, 0] - logz[:-1]
    trained = t.owner_T[1:] >= 0
    nll, count = nll - logp[trained].sum(), count + trained.sum()
  np.testing.assert_allclose(loss, nll / count, rtol=1e-5)
