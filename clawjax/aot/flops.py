"""The learner step's FLOPs and HBM traffic counted from the model's shapes.

XLA's cost analysis counts a loop body once, and the step is loops (micro-batches, key blocks, logits
chunks), and it sees inside a Pallas kernel only the cost estimate the kernel carries (the MoE's megablox
grouped matmuls carry 2 m k n, the tree-attention kernel none); so the step time is estimated from this
count. Matmuls only (2 FLOPs a multiply-add); a backward pass is twice its forward; attention over a full
causal row (each query sees (T + 1) / 2 keys on average: an upper bound for tree rows, whose branches see
less); an MoE layer's experts top_k x 3 x d_model x moe_mlp_dim a token, the work of the grouped matmuls'
rows (a TPU kernel's partly filled row tiles, at most one more a group, are not counted).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from clawjax.models.config import ModelConfig
from clawjax.rl.config import LearnerConfig


@dataclasses.dataclass(frozen=True)
class StepCount:
  flops: float          # every FLOP the step runs, layer recompute included
  model_flops: float    # without the recompute: the work an MFU is measured by
  hbm_bytes: float      # per device: weight reads and optimizer traffic (activations not counted)


def active_params(m: ModelConfig) -> int:
  """Parameters a token's forward multiplies by (top_k experts of an MoE layer; the embedding is a lookup)."""
  attn = m.d_model * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim + m.n_heads * m.head_dim * m.d_model
  per_layer = [attn + (m.d_model * m.n_experts + m.top_k * 3 * m.d_model * m.moe_mlp_dim if m.is_moe_layer(i)
                       else 3 * m.d_model * m.mlp_dim) for i in range(m.n_layers)]
  return sum(per_layer) + m.d_model * m.vocab_size


def total_params(m: ModelConfig) -> int:
  """Every parameter (norms left out: they are not matmuls and are tiny)."""
  attn = m.d_model * (m.n_heads + 2 * m.n_kv_heads) * m.head_dim + m.n_heads * m.head_dim * m.d_model
  mlp = sum(m.d_model * m.n_experts + m.n_experts * 3 * m.d_model * m.moe_mlp_dim if m.is_moe_layer(i)
            else 3 * m.d_model * m.mlp_dim for i in range(m.n_layers))
  return m.n_layers * attn + mlp + m.d_model * m.vocab_size * (1 if m.tie_embeddings else 2)


def forward_flops(m: ModelConfig, *, tokens: float, attended_pairs: float, logit_tokens: float
                  ) -> tuple[float, float, float]:
  """A forward pass's matmul FLOPs as (layers' projections and MLPs over `tokens`, attention scores QK^T and
  PV over `attended_pairs` query-key pairs in each layer, vocabulary projection at `logit_tokens`). A step
  that ran is measured by 3 x their sum (forward and backward, recomputation not counted): the MFU of
  scripts/device_check.py and of its PyTorch peer."""
  layers = 2.0 * (active_params(m) - m.d_model * m.vocab_size) * tokens
  scores = 4.0 * m.n_heads * m.head_dim * m.n_layers * attended_pairs
  return layers, scores, 2.0 * m.d_model * m.vocab_size * logit_tokens


def _trunk_flops_per_token(m: ModelConfig, row_len: int) -> float:
  """A token's forward through the layers, attending to (row_len + 1) / 2 keys in each (a causal row)."""
  return sum(forward_flops(m, tokens=1, attended_pairs=(row_len + 1) / 2, logit_tokens=0))


def step_count(m: ModelConfig, learner: LearnerConfig, *, rows: int, row_len: int, loss_slots: int,
               devices: int, weight_shards: int) -> StepCount:
  """The step of `learner` on `rows` packed rows of `row_len` tokens (`loss_slots` of each row through the
  vocab projection) over `devices`, each reading 1 / `weight_shards` of the weights (tensor x expert axes)."""
  trunk = _trunk_flops_per_token(m, row_len) * rows * row_len
  loss_tokens = rows * loss_slots
  head = 2 * m.d_model * m.vocab_size * loss_tokens
  trunks = 2 if learner.value.kind == "separate" else 1  # the critic's own trunk
  old = (trunk + head) * (1 + (1 if learner.kl_coef else 0)) + (trunks - 1) * trunk
  update = 3 * (trunks * trunk + head)      # forward and backward
  # remat layers; logits chunks are always recomputed; value.two_pass runs the critic's forward again
  recompute = (trunks * trunk if m.remat else 0) + head + (trunk if learner.value.two_pass else 0)
  model_flops = old + learner.epochs * update
  flops = model_flops + learner.epochs * recompute
  weight_bytes = total_params(m) * trunks * jnp.dtype(m.dtype).itemsize / weight_shards
  reads = learner.micro_batches * (1 + learner.epochs * (3 + (1 if m.remat else 0)))
  updates = learner.epochs * learner.minibatches
  # f32 master weights and Adam moments read and written, the gradient read, once per update; the
  # gradient accumulator read and written once per micro-batch.
  state_bytes = total_params(m) * trunks * 4 / devices
  optimizer = updates * 7 * state_bytes + learner.epochs * learner.micro_batches * 2 * state_bytes
  return StepCount(flops=flops, model_flops=model_flops, hbm_bytes=weight_bytes * reads + optimizer)
