"""Rollout routing replay: a MoE layer made to route tokens to the experts the rollout engine chose.

The learner recomputes every token's top-k experts from its own router; between an engine and a trainer
a few percent of those choices differ (numerics, batch shapes), so the learner would train experts the
rollout never ran. With a `Replay` the MoE layers take the engine's expert ids instead ("Rollout Routing
Replay", arXiv 2510.11370) for the tokens that have one (`replay_BT`), and recompute only the weights:
softmax over all experts of the learner's live router logits, gathered at the replayed ids and
renormalised as `norm_topk_prob` says. The router therefore keeps its gradient (through the gathered
probabilities). Tokens without a route (padding; a call whose engine gave none) route live, exactly as
without replay.

`Replay.experts_BTLK` holds, per token, the ids of every MoE layer in order (layer l of the model's
MoE layers: `moe_layer_index`); `disagree_BT` counts, per token, the MoE layers where the learner's own
top-k (as a set) differs from the replayed one.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from clawjax.models.config import ModelConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Replay:
  """Expert ids to force, [B, T, moe_layers, top_k] (any integer dtype), and which tokens have them."""
  experts_BTLK: jax.Array
  replay_BT: jax.Array


def moe_layer_index(cfg: ModelConfig) -> dict[int, int]:
  """Decoder layer -> its place among the MoE layers (the layer axis of routes)."""
  moe = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
  return {layer: k for k, layer in enumerate(moe)}


def top_k_routing(logits_NE: jax.Array, cfg: ModelConfig, forced_NK: jax.Array | None = None,
                  replay_N: jax.Array | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(top-k weights [N, k] float32, expert ids [N, k] int32, disagree [N] bool) from float32 router logits.

  Live: the k most probable experts of softmax(logits), their probabilities renormalised to sum to 1 when
  `norm_topk_prob`. With `forced_NK`, tokens where `replay_N` holds take those ids and the probabilities
  at them instead; `disagree_N` marks the replayed tokens whose live top-k set differs (False elsewhere).
  A token routed live gets bit for bit the weights it gets without replay (the same probabilities)."""
  probs_NE = jax.nn.softmax(logits_NE, axis=-1)
  weights_NK, experts_NK = jax.lax.top_k(probs_NE, cfg.top_k)
  disagree_N = jnp.zeros(logits_NE.shape[0], bool)
  if forced_NK is not None:
    forced_NK = forced_NK.astype(experts_NK.dtype)
    disagree_N = replay_N & jnp.any(jnp.sort(forced_NK, axis=-1) != jnp.sort(experts_NK, axis=-1), axis=-1)
    experts_NK = jnp.where(replay_N[:, None], forced_NK, experts_NK)
    weights_NK = jnp.where(replay_N[:, None], jnp.take_along_axis(probs_NE, experts_NK, axis=-1), weights_NK)
  if cfg.norm_topk_prob:
    weights_NK = weights_NK / jnp.sum(weights_NK, axis=-1, keepdims=True)
  return weights_NK, experts_NK, disagree_N
