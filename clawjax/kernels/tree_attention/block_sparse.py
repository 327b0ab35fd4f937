"""The block-sparse layout the Pallas tree-attention kernels read (TPU and GPU alike).

With one block size for queries and keys, the keys of key block kj reach query block qi iff kj <= qi and
some real key of kj has subtree_end > qi * block (a key's subtree never leaves its tree, so the segment
test adds nothing at block granularity). That table is computed on device per row and compacted into, for
every (row, query block), the list of visible key blocks and its length, and transposed, for every
(row, key block), the list of query blocks that see it: a kernel walks a list, so an invisible block is
neither loaded nor computed. Inside a visible tile the kernels apply the mask rule of mask.py.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from clawjax.kernels.tree_attention.mask import real


def block_table(segment_ids_BT: jax.Array, subtree_end_BT: jax.Array, block: int) -> jax.Array:
  """[B, nq, nq] bool: can any query of block qi see any key of block kj? T must be a multiple of block.
  Exact up to the segment test, which a key's subtree (inside its own tree) already implies."""
  b, t = segment_ids_BT.shape
  nb = t // block
  reach_BT = jnp.where(real(segment_ids_BT), subtree_end_BT, 0)
  reach_Bk = jnp.max(reach_BT.reshape(b, nb, block), axis=2)  # furthest query any key of the block reaches
  blocks = jnp.arange(nb)
  q_1q1, k_11k = blocks[None, :, None], blocks[None, None, :]
  return (k_11k <= q_1q1) & (reach_Bk[:, None, :] > q_1q1 * block)


def compact(table_Bqk: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per (row, outer block): the visible inner blocks in ascending order, then the last one repeated (so
  a step past the end fetches nothing new), and their count. ([B, nq, nk] int32, [B, nq] int32)."""
  nk = table_Bqk.shape[2]
  count_Bq = jnp.sum(table_Bqk, axis=2, dtype=jnp.int32)
  # A stable sort of "invisible" flags puts the visible block indices first, in order.
  order_Bqk = jnp.argsort(~table_Bqk, axis=2, stable=True).astype(jnp.int32)
  last_Bq1 = jnp.take_along_axis(order_Bqk, jnp.maximum(count_Bq - 1, 0)[..., None], axis=2)
  steps_11k = jnp.arange(nk)[None, None, :]
  return jnp.where(steps_11k < count_Bq[..., None], order_Bqk, last_Bq1), count_Bq


@dataclasses.dataclass(frozen=True)
class VisibleLists:
  """Both walks of one call's block table: key blocks per query block (forward, dQ) and query blocks per
  key block (dK/dV), each with its counts."""
  kv_list_Bqk: jax.Array
  kv_count_Bq: jax.Array
  q_list_Bkq: jax.Array
  q_count_Bk: jax.Array


def visible_lists(segment_ids_BT: jax.Array, subtree_end_BT: jax.Array, block: int) -> VisibleLists:
  table_Bqk = block_table(segment_ids_BT, subtree_end_BT, block)
  return VisibleLists(*compact(table_Bqk), *compact(table_Bqk.swapaxes(1, 2)))


def pallas_attention_flops(visible_blocks: int | jax.Array, block: int, head_dim: int, n_heads: int,
                           backward: bool = True) -> float:
  """Analytical FLOPs of the kernels (cost analysis cannot see inside them). `visible_blocks`: visible
  (query block, key block) pairs summed over rows (`block_table(...).sum()`); `n_heads`: query heads.
  Each visible pair and query head costs matmuls of block x block x head_dim (2 * block^2 * head_dim
  FLOPs each): 2 forward (QK^T, PV); backward 3 in the dQ kernel (QK^T, dO V^T, dS K) and 4 in the dK/dV
  kernel (QK^T, P^T dO, dO V^T, dS^T Q). `backward`: forward + backward (9 matmuls), else forward (2)."""
  matmuls = 9 if backward else 2
  return matmuls * 2.0 * float(visible_blocks) * block * block * head_dim * n_heads


def pad_to_block(pad: int, q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT) -> tuple[jax.Array, ...]:
  """The kernel arguments with `pad` positions appended to T (the block kernels tile T): padded
  positions get segment 0, so they are invisible, and their outputs are sliced off."""
  if not pad:
    return q_BTNH, k_BTKH, v_BTKH, segment_ids_BT, subtree_end_BT
  widths = ((0, 0), (0, pad), (0, 0), (0, 0))
  return (*(jnp.pad(x, widths) for x in (q_BTNH, k_BTKH, v_BTKH)),
          *(jnp.pad(x, ((0, 0), (0, pad))) for x in (segment_ids_BT, subtree_end_BT)))
