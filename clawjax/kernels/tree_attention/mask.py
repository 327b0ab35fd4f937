"""The mask rule of tree attention: the one definition that the references (on whole rows), the
block-sparse table (on blocks) and the kernels (on tiles) all apply.

Segment ids (the packed batch's, clawjax/tree/batch.py): a position whose id is > 0 holds a token of that
segment; any other id is padding, which sees nothing and which nothing sees. Producers write 0 for padding
and `PackedBatch` refuses a negative id; an implementation reached some other way still reads a negative
id as padding, so every implementation gives the same answer on any input. Key j is visible to query i iff
  segment[i] == segment[j] > 0  and  j <= i < subtree_end[j].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def real(segment_ids: jax.Array) -> jax.Array:
  """Which positions hold a token (the rest are padding)."""
  return segment_ids > 0


def visible(q_seg, q_index, k_seg, k_index, k_end) -> jax.Array:
  """The rule on broadcastable arrays: query segment ids and row indices against key segment ids, row
  indices and subtree ends (a tile: [Q, 1] queries against [1, K] keys)."""
  return (q_seg == k_seg) & real(q_seg) & (k_index <= q_index) & (q_index < k_end)


def tree_mask(q_index_BT: jax.Array, q_segment_BT: jax.Array, k_segment_BS: jax.Array,
              k_subtree_end_BS: jax.Array, k_start: jax.Array | int = 0) -> jax.Array:
  """[B, T, S] bool: is key s (row index k_start + s) visible to the query at row index q_index[t]?"""
  k_index_11S = (k_start + jnp.arange(k_segment_BS.shape[1]))[None, None, :]
  return visible(q_segment_BT[:, :, None], q_index_BT[:, :, None], k_segment_BS[:, None, :], k_index_11S,
                 k_subtree_end_BS[:, None, :])
