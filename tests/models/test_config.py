"""Presets against the families' published sizes, HF config round trips, remat."""
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from clawjax.models.config import PRESETS, ModelConfig, preset
from clawjax.models.model import Decoder, causal_inputs

# Published parameter counts (model cards): total, and without the embedding tables.
PUBLISHED = {
    "smollm2-135m": (134.5e6, None),
    "qwen3-0.6b": (0.6e9, 0.44e9),
    "qwen3-8b": (8.2e9, 6.95e9),
    "qwen3-30b-a3b": (30.5e9, 29.9e9),
}


def n_params(cfg: ModelConfig) -> tuple[int, int]:
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
  tables = 1 if cfg.tie_embeddings else 2  # the cards' "non-embedding" excludes lm_head too
  return total, total - tables * cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_sizes_match_published(name):
  total, non_embedding = n_params(PRESETS[name])
  want_total, want_non_embedding = PUBLISHED[name]
  # The cards round to 2-3 significant digits.
  assert abs(total - want_total) / want_total < 0.03, total
  if want_non_embedding:
    assert abs(non_embedding - want_non_embedding) / want_non_embedding < 0.03, non_embedding


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_hf_config_round_trip(name):
  cfg = PRESETS[name]
  assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg


def test_bad_configs_are_named():
  with pytest.raises(ValueError, match="n_kv_heads"):
    preset("test-tiny", n_kv_heads=3)
  with pytest.raises(ValueError, match="model_type"):
    ModelConfig.from_hf_config({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="attention_impl"):
    Decoder(preset("test-tiny-vocab", attention_impl="flash"), rngs=nnx.Rngs(0))


def test_remat_gradients_match():
  tokens = jax.random.randint(jax.random.key(1), (1, 8), 0, 512)
  grads = []
  for remat in (False, True):
    model = Decoder(preset("test-tiny-vocab", n_layers=1, remat=remat), rngs=nnx.Rngs(0))
    grads.append(nnx.jit(nnx.grad(lambda m: jnp.mean(m(*causal_inputs(tokens)) ** 2)))(model))
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    assert jnp.allclose(a, b, rtol=1e-5, atol=1e-7)
