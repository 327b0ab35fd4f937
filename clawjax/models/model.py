"""The decoder (Llama / Qwen3 / Qwen3-MoE) over tree-packed rows.

Public API (stable; the learner and the KV-cache engine build on it):
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  logits_BTV = model(tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT)   # float32
  hidden_BTD = model.hidden(tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT)  # after final norm
  logits_BTV = model.logits(hidden_BTD)      # vocab projection only: gather hidden at parent_index first
  x_BTD = model.embed(tokens_BT)
  for layer in model.layers:                 # DecoderLayer
    x_BTD = layer(x_BTD, positions_BT, segment_ids_BT, subtree_end_BT)
    # or piecewise: layer.attn_norm, layer.attn.project_qkv / project_out, layer.mlp_norm, layer.mlp
  hidden_BTD = model.final_norm(x_BTD)
  hidden_BTD, disagree_BT = model.routed_hidden(tokens_BT, ..., replay)  # MoE: the engine's experts
Inputs follow clawjax/tree/batch.py: positions are tree depths (RoPE), the mask comes from segment_ids and
subtree_end. For a plain causal sequence use `causal_inputs`. `replay` (clawjax.models.routing.Replay)
forces the MoE layers' expert choices; `hidden(..., replay)` is routed_hidden's hidden state.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from clawjax.models.attention import Attention
from clawjax.models.config import ModelConfig
from clawjax.models.layers import MLP, RMSNorm, constrain, einsum_f32, param
from clawjax.models.moe import MoE
from clawjax.models.routing import Replay, moe_layer_index


class DecoderLayer(nnx.Module):
  """Pre-norm block: x + attn(attn_norm(x)), then + mlp(mlp_norm(x)); mlp is `MLP` or `MoE`."""

  def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.param_dtype, ("embed",), rngs=rngs)
    self.attn = Attention(cfg, rngs=rngs)
    self.mlp_norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.param_dtype, ("embed",), rngs=rngs)
    self.mlp = MoE(cfg, rngs=rngs) if cfg.is_moe_layer(layer) else MLP(cfg, cfg.mlp_dim, rngs=rngs)

  def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
               subtree_end_BT: jax.Array) -> jax.Array:
    x_BTD = self._attend(x_BTD, positions_BT, segment_ids_BT, subtree_end_BT)
    return self._add_mlp(x_BTD, self.mlp(self.mlp_norm(x_BTD)))

  def replayed(self, x_BTD: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
               subtree_end_BT: jax.Array, experts_BTK: jax.Array, replay_BT: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
    """A MoE layer with the expert ids `experts_BTK` forced where `replay_BT` (clawjax.models.routing):
    (output, whether each replayed token's own top-k differs)."""
    x_BTD = self._attend(x_BTD, positions_BT, segment_ids_BT, subtree_end_BT)
    y_BTD, disagree_BT = self.mlp.replayed(self.mlp_norm(x_BTD), experts_BTK, replay_BT)
    return self._add_mlp(x_BTD, y_BTD), disagree_BT

  def _attend(self, x_BTD: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
              subtree_end_BT: jax.Array) -> jax.Array:
    # Constrained per branch so a tensor-parallel partial sum is reduced before the residual add.
    attn_BTD = self.attn(self.attn_norm(x_BTD), positions_BT, segment_ids_BT, subtree_end_BT)
    return x_BTD + constrain(attn_BTD, ("batch", "length", "embed"))

  @staticmethod
  def _add_mlp(x_BTD: jax.Array, mlp_BTD: jax.Array) -> jax.Array:
    x_BTD = x_BTD + constrain(mlp_BTD, ("batch", "length", "embed"))
    return constrain(x_BTD, ("batch", "length", "embed"))


def _remat_layers(layers: Sequence[DecoderLayer], policy: str, x_BTD: jax.Array, *args: jax.Array,
                  replay: _LayerReplay | None = None):
  """The layers applied in turn, each one's activations recomputed in the backward pass, except those that
  the `jax.checkpoint_policies` entry named `policy` saves (`ModelConfig.remat_policy`).

  Consecutive layers of one structure (all of a Qwen3 or Qwen3-MoE model) run as a `lax.scan` over their
  parameters, stacked here while tracing (the model keeps one module per layer: checkpoints and HF
  import / export are unchanged). With the layers unrolled instead, XLA may schedule every layer's
  recomputation as soon as its input exists, right after the forward pass, so all layers' activations
  are live at once and remat saves nothing; a scan's backward runs one layer's recomputation and
  gradient after another.

  Each layer is split into graph and parameters and merged again inside `jax.checkpoint`, so the
  checkpointed function is pure and traces inside any transform of the caller's (the learner's
  `lax.map` / `lax.scan` over micro-batches); `nnx.remat` there writes the inner trace's parameters back
  into the outer module and fails (TraceContextError).

  With `replay`, a MoE group's scan also runs over its layers' expert ids; returns (x, disagree_BT)."""
  split = [nnx.split(layer) for layer in layers]
  checkpoint = lambda step: jax.checkpoint(step, policy=getattr(jax.checkpoint_policies, policy))
  disagree_BT, first = None if replay is None else jnp.zeros(x_BTD.shape[:2], jnp.int32), 0
  for graph, group in itertools.groupby(split, key=lambda gs: gs[0]):
    group = list(group)
    stacked = jax.tree.map(lambda *ps: jnp.stack(ps), *(params for _, params in group))
    if replay is None or first not in replay.index:
      step = lambda x_BTD, params, graph=graph: (nnx.merge(graph, params)(x_BTD, *args), None)
      x_BTD, _ = jax.lax.scan(checkpoint(step), x_BTD, stacked)
    else:  # consecutive MoE layers: consecutive places among the MoE layers
      k = replay.index[first]
      step = lambda x_BTD, xs, graph=graph: nnx.merge(graph, xs[0]).replayed(x_BTD, *args, xs[1], replay.replay_BT)
      x_BTD, disagree_LBT = jax.lax.scan(checkpoint(step), x_BTD, (stacked, replay.experts_LBTK[k:k + len(group)]))
      disagree_BT = disagree_BT + jnp.sum(disagree_LBT, axis=0, dtype=jnp.int32)
    first += len(group)
  return x_BTD if replay is None else (x_BTD, disagree_BT)


@dataclasses.dataclass(frozen=True)
class _LayerReplay:
  """A Replay laid out by layer: ids [moe_layers, B, T, top_k], and each MoE layer's place among them."""
  experts_LBTK: jax.Array
  replay_BT: jax.Array
  index: dict[int, int]


class Decoder(nnx.Module):
  """Decoder-only LM; see the module docstring for the API."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embedding = param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"), cfg.param_dtype,
                           fan_in=cfg.d_model)  # tied logits of a random model stay O(1)
    self.layers = nnx.List([DecoderLayer(cfg, i, rngs=rngs) for i in range(cfg.n_layers)])
    self.final_norm = RMSNorm(cfg.d_model, cfg.rms_eps, cfg.param_dtype, ("embed",), rngs=rngs)
    self.lm_head = None if cfg.tie_embeddings else param(
        rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"), cfg.param_dtype)

  def embed(self, tokens_BT: jax.Array) -> jax.Array:
    # FSDP-gather the table's "embed" dim first: a lookup from it cannot re-split rows over the batch axes.
    table_VD = constrain(self.embedding[...], ("vocab", None))
    x_BTD = jnp.take(table_VD, tokens_BT, axis=0).astype(self.cfg.dtype)
    return constrain(x_BTD, ("batch", "length", "embed"))

  def hidden(self, tokens_BT: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
             subtree_end_BT: jax.Array, replay: Replay | None = None) -> jax.Array:
    if replay is not None:
      return self.routed_hidden(tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT, replay)[0]
    x_BTD = self.embed(tokens_BT)
    if self.cfg.remat:
      return self.final_norm(_remat_layers(self.layers, self.cfg.remat_policy, x_BTD, positions_BT,
                                           segment_ids_BT, subtree_end_BT))
    for layer in self.layers:
      x_BTD = layer(x_BTD, positions_BT, segment_ids_BT, subtree_end_BT)
    return self.final_norm(x_BTD)

  def routed_hidden(self, tokens_BT: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
                    subtree_end_BT: jax.Array, replay: Replay) -> tuple[jax.Array, jax.Array]:
    """`hidden` with the MoE layers' experts forced where `replay.replay_BT` (clawjax.models.routing), and
    per token the number of MoE layers whose own top-k differs from the replayed one, [B, T] int32."""
    args = (positions_BT, segment_ids_BT, subtree_end_BT)
    layers = _LayerReplay(jnp.moveaxis(replay.experts_BTLK, 2, 0), replay.replay_BT, moe_layer_index(self.cfg))
    if len(layers.index) != layers.experts_LBTK.shape[0]:
      raise ValueError(f"Replay: routes of {layers.experts_LBTK.shape[0]} MoE layers for a model with "
                       f"{len(layers.index)}")
    x_BTD = self.embed(tokens_BT)
    if self.cfg.remat:
      x_BTD, disagree_BT = _remat_layers(self.layers, self.cfg.remat_policy, x_BTD, *args, replay=layers)
      return self.final_norm(x_BTD), disagree_BT
    disagree_BT = jnp.zeros(tokens_BT.shape, jnp.int32)
    for i, layer in enumerate(self.layers):
      if i in layers.index:
        x_BTD, disagree = layer.replayed(x_BTD, *args, layers.experts_LBTK[layers.index[i]], layers.replay_BT)
        disagree_BT = disagree_BT + disagree.astype(jnp.int32)
      else:
        x_BTD = layer(x_BTD, *args)
    return self.final_norm(x_BTD), disagree_BT

  def logits(self, hidden_BTD: jax.Array) -> jax.Array:
    """Vocab projection with float32 accumulation and output (log-probs need float32)."""
    dtype = self.cfg.dtype
    if self.lm_head is None:
      logits = einsum_f32("...d,vd->...v", hidden_BTD.astype(dtype), self.embedding[...].astype(dtype))
    else:
      logits = einsum_f32("...d,dv->...v", hidden_BTD.astype(dtype), self.lm_head[...].astype(dtype))
    # Vocab-parallel: each tensor shard keeps its slice of the (largest) activation; the softmax reduces.
    return constrain(logits, ("batch",) + ("length",) * (logits.ndim - 2) + ("vocab",))

  def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array, segment_ids_BT: jax.Array,
               subtree_end_BT: jax.Array) -> jax.Array:
    return self.logits(self.hidden(tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT))


def causal_inputs(tokens_BT: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(tokens, positions, segment_ids, subtree_end) for plain causal rows: one segment, no padding."""
  b, t = tokens_BT.shape
  positions_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  return tokens_BT, positions_BT, jnp.ones((b, t), jnp.int32), jnp.full((b, t), t, jnp.int32)
