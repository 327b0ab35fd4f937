"""Tree attention in the decoder: tree-packed logits == each root-to-leaf path run alone."""
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.models.config import preset
from clawjax.models.model import Decoder, causal_inputs

from tests.kernels.test_tree_attention import packed_rows
from tests.models.helpers import forward, rel_err


@pytest.mark.parametrize("name,impl", [("test-tiny-vocab", "dense"), ("test-tiny-vocab", "blocked"),
                                       ("test-tiny-moe", "blocked")])
def test_tree_logits_equal_paths_alone(name, impl):
  cfg = preset(name, attention_impl=impl, attention_block=16)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  rows, trees = packed_rows(5, 64, vocab=cfg.vocab_size)
  packed = forward(model, *(jnp.asarray(rows[k]) for k in ("tokens", "positions", "segment_ids", "subtree_end")))
  # Every path as its own causal sequence (padded at the end, which a causal model never sees).
  paths, where = [], []
  for r, row_trees in enumerate(trees):
    offset = 0
    for tree in row_trees:
      for path in tree.paths:
        paths.append(tree.tokens[path])
        where.append((r, offset + np.asarray(path)))
      offset += len(tree.tokens)
  longest = max(len(p) for p in paths)
  alone_tokens = np.zeros((len(paths), longest), np.int32)
  for i, p in enumerate(paths):
    alone_tokens[i, :len(p)] = p
  alone = np.asarray(forward(model, *causal_inputs(jnp.asarray(alone_tokens))))
  assert len(paths) > len(trees[0]) + len(trees[1])  # some tree actually branches
  for i, (r, idx) in enumerate(where):
    assert rel_err(packed[r, idx], alone[i, :len(idx)]) < 1e-5
