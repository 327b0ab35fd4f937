"""The learner's side of rollout routing replay (clawjax.models.routing): which steps replay, the routes a
batch carries (the policy's MoE layers' out of what the engine logged), and the step's routing metrics."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp

from clawjax.models.config import ModelConfig
from clawjax.models.routing import moe_layer_index
from clawjax.rl.device_batch import RouteLayout
from clawjax.routes import moe_layers
from clawjax.tree.batch import PackedBatch

log = logging.getLogger(__name__)


class ReplaySetup:
  """`LearnerConfig.routing_replay` for one policy (and critic trunk): `routes_of` readies a batch's routes,
  `layout` says how a step's batches carry them. "auto" and "rollout" replay a MoE policy's routes; a
  dense policy, or "off", never carries any."""

  def __init__(self, mode: str, policy: ModelConfig | None, critic_trunk: ModelConfig | None = None):
    self.mode = mode
    self.cfg = policy
    index = moe_layer_index(policy) if policy is not None else {}
    self.moe = sorted(index)
    if mode == "rollout" and not self.moe:
      raise ValueError("LearnerConfig.routing_replay='rollout' needs a MoE policy; this one has no MoE layer")
    # A separate critic trunk replays the same ids when it routes like the policy (same MoE layers, experts).
    self.critic = critic_trunk is not None and bool(self.moe) and (
        moe_layer_index(critic_trunk) == index and (critic_trunk.n_experts, critic_trunk.top_k) ==
        (policy.n_experts, policy.top_k))

  @property
  def on(self) -> bool:
    return self.mode != "off" and bool(self.moe)

  @property
  def moe_layers(self) -> int:
    return len(self.moe)

  def routes_of(self, batch: PackedBatch) -> PackedBatch:
    """`batch` with the routes the step replays: the policy's MoE layers' ids, checked against the model,
    or none (not replaying; the batch logged none)."""
    if not self.on or batch.routes_RTLK is None:
      if self.mode == "rollout":
        raise ValueError("LearnerConfig.routing_replay='rollout': the step's calls carry no routed experts (embedded "
                         "engine: record_routes; sglang / vllm: --backend-arg routed_experts=TOP_K and the server's "
                         "--enable-return-routed-experts)")
      if self.on and batch.loss_mask_RT().any():
        log.warning("routing replay: a MoE policy's batch without routed experts routes live (ask the engine for "
                    "them: record_routes / --backend-arg routed_experts=TOP_K)")
      return batch if batch.routes_RTLK is None else dataclasses.replace(batch, routes_RTLK=None, routed_RT=None)
    cfg = self.cfg
    try:
      ids = moe_layers(batch.routes_RTLK, cfg.n_layers, self.moe)
    except ValueError as e:
      raise ValueError(f"routing replay: {e}") from None
    if ids.shape[-1] != cfg.top_k:
      raise ValueError(f"routing replay: routes of {ids.shape[-1]} experts per token, the model routes to "
                       f"top_k={cfg.top_k}: the engine serves another model")
    used = ids[batch.routed_RT]
    if used.size and int(used.max()) >= cfg.n_experts:
      raise ValueError(f"routing replay: expert id {int(used.max())} in the routes, the model has "
                       f"{cfg.n_experts} experts: the engine serves another model")
    return dataclasses.replace(batch, routes_RTLK=ids)

  def layout(self, route_bytes: int) -> RouteLayout | None:
    """How a step's batches carry routes when the widest holds ids of `route_bytes` bytes (0: none does)."""
    return (len(self.moe), self.cfg.top_k, route_bytes) if route_bytes else None


def routing_stats(segment_ids_RT: jax.Array, subtree_end_RT: jax.Array, replay_RT: jax.Array,
                  disagree_RT: jax.Array) -> jax.Array:
  """Per row [r, 4] float32: the positions a trained token's log-prob depends on (real tokens with a child:
  all but padding and each leaf's last token), those replayed, the replayed (token, MoE layer) pairs whose
  own top-k differs, and the replayed tokens with such a layer."""
  t = segment_ids_RT.shape[-1]
  counted = (segment_ids_RT > 0) & (subtree_end_RT > jnp.arange(1, t + 1))
  replayed = counted & replay_RT
  disagree = jnp.where(replayed, disagree_RT, 0)
  f32 = lambda x: jnp.sum(x, axis=-1, dtype=jnp.float32)
  return jnp.stack([f32(counted), f32(replayed), f32(disagree), f32(disagree > 0)], axis=-1)


def routing_metrics(stats: jax.Array, moe_layers: int) -> dict[str, jax.Array]:
  """The step's routing metrics from every row's `routing_stats` (summed over the leading axes)."""
  counted, replayed, pairs, tokens = jnp.sum(stats.reshape(-1, 4), axis=0)
  return {"routing/replayed_frac": replayed / jnp.maximum(counted, 1.0),
          "routing/disagree_frac": pairs / jnp.maximum(replayed * moe_layers, 1.0),
          "routing/tokens_any_disagree": tokens / jnp.maximum(replayed, 1.0)}
