"""remat=True keeps only each layer's input for the backward pass: the compiled gradient's temporaries grow
per layer by about that much, not by the layer's activations (the layers run as a scan over stacked
parameters; unrolled, XLA schedules every layer's recomputation right after the forward pass). The
gradients equal remat=False's, also for a model whose layers differ in structure (dense and MoE)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax.models.config import PRESETS, ModelConfig
from clawjax.models.model import Decoder, causal_inputs

# Wide enough that a layer's activations dwarf its parameters, which the scan stacks (a copy per layer).
WIDE = PRESETS["test-tiny-vocab"].replace(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, mlp_dim=512,
                                          attention_impl="blocked", remat=True)
ROW_LEN = 2048


def _grad_fn(cfg: ModelConfig):
  graph, params = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))

  def loss(params, tokens_BT):
    hidden_BTD = nnx.merge(graph, params).hidden(*causal_inputs(tokens_BT)).astype(jnp.float32)
    # A fixed projection: the sum of squares of a normalised output would be ~constant, its gradient noise.
    return jnp.sum(hidden_BTD * jnp.sin(jnp.arange(hidden_BTD.size, dtype=jnp.float32)).reshape(hidden_BTD.shape))

  return jax.grad(loss), params


def _temp_bytes(cfg: ModelConfig) -> int:
  grad, params = _grad_fn(cfg)
  tokens = jax.ShapeDtypeStruct((1, ROW_LEN), jnp.int32)
  return jax.jit(grad).lower(params, tokens).compile().memory_analysis().temp_size_in_bytes


def test_remat_temporaries_grow_per_layer_by_about_the_layer_input():
  per_layer = (_temp_bytes(WIDE.replace(n_layers=4)) - _temp_bytes(WIDE.replace(n_layers=2))) / 2
  layer_input = ROW_LEN * WIDE.d_model * jnp.dtype(WIDE.dtype).itemsize
  # The layer input, its gradient and the layer's stacked parameters and their gradients: ~3x here.
  # Without the scan it is ~22x (every activation of every layer live at once).
  assert per_layer < 4 * layer_input, (per_layer / 2**20, layer_input / 2**20)


def test_remat_gradients_equal_plain():
  cfg = PRESETS["test-tiny-moe"].replace(n_layers=3, mlp_only_layers=(0,))  # a dense layer, then two MoE
  tokens_BT = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 32)), jnp.int32)
  model = Decoder(cfg.replace(remat=False), rngs=nnx.Rngs(0))
  params = nnx.state(model)
  grads = {}
  for remat in (False, True):
    grad, _ = _grad_fn(cfg.replace(remat=remat))
    grads[remat] = jax.jit(grad)(params, tokens_BT)
  for plain, remat in zip(jax.tree.leaves(grads[False]), jax.tree.leaves(grads[True])):
    assert jnp.linalg.norm(remat - plain) <= 1e-5 * jnp.linalg.norm(plain)
