"""Logit parity with transformers (torch float32 CPU) on tiny random Llama / Qwen3 / Qwen3-MoE checkpoints,
loaded through hf_io, and the save -> load round trip."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from clawjax.models import hf_io
from clawjax.models.model import causal_inputs
from tests.models.helpers import forward, rel_err, save_fused

# (HF model kind, config overrides, our attention kernel): each kernel meets each family at least once;
# test_tree_attention.py checks the kernels against each other.
CASES = {
    "llama-tied": ("llama", {}, "dense"),
    "qwen3-untied": ("qwen3", {"tie_word_embeddings": False}, "blocked"),
    "qwen3-moe": ("qwen3_moe", {}, "dense"),
    "qwen3-moe-mixed": ("qwen3_moe", {"decoder_sparse_step": 2, "norm_topk_prob": False}, "blocked"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(case, save_tiny_hf):
  kind, overrides, impl = CASES[case]
  hf_dir, hf_model = save_tiny_hf(kind, **overrides)
  tokens = np.random.default_rng(0).integers(0, 128, size=(2, 24), dtype=np.int32)
  with torch.no_grad():
    ref = hf_model(torch.from_numpy(tokens).long()).logits.numpy()
  model = hf_io.load(hf_dir, attention_impl=impl, attention_block=8)
  assert rel_err(forward(model, *causal_inputs(jnp.asarray(tokens))), ref) < 1e-4


def test_save_load_round_trip_sharded(save_tiny_hf, tmp_path):
  hf_dir, hf_model = save_tiny_hf("qwen3_moe", decoder_sparse_step=2)
  model = hf_io.load(hf_dir)
  out = hf_io.save(model, tmp_path / "export", max_shard_bytes=100_000)
  index = json.loads((out / hf_io.INDEX_FILE).read_text())
  assert len(set(index["weight_map"].values())) > 1
  # Same tensor names and values as transformers wrote (our export is the Hub layout).
  import transformers
  back = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  theirs = hf_model.state_dict()
  for name, value in back.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), theirs[name].numpy(), err_msg=name)
  again = hf_io.load(out)
  tokens = jnp.arange(10, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(forward(again, *causal_inputs(tokens)), forward(model, *causal_inputs(tokens)))


def test_bf16_params(save_tiny_hf):
  hf_dir, _ = save_tiny_hf("qwen3")
  model = hf_io.load(hf_dir, param_dtype="bfloat16", dtype="bfloat16")
  assert model.layers[0].attn.q_proj[...].dtype == jnp.bfloat16
  ref = hf_io.load(hf_dir)
  tokens = jnp.arange(12, dtype=jnp.int32)[None]
  assert rel_err(forward(model, *causal_inputs(tokens)), forward(ref, *causal_inputs(tokens))) < 5e-2


def test_bad_checkpoint_names_the_tensor(save_tiny_hf):
  hf_dir, _ = save_tiny_hf("qwen3")
  cfg = json.loads((hf_dir / "config.json").read_text())
  cfg["num_hidden_layers"] = 3
  (hf_dir / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(KeyError, match="model.layers.2"):
    hf_io.load(hf_dir)


def test_fused_expert_layout_loads(save_tiny_hf, tmp_path):
  """transformers 5 keeps experts fused in memory (gate_up_proj [E, 2F, D]); such a dump loads too."""
  hf_dir, hf_model = save_tiny_hf("qwen3_moe")
  fused_dir = save_fused(hf_dir, hf_model, tmp_path / "fused")
  tokens = jnp.arange(12, dtype=jnp.int32)[None]
  np.testing.assert_array_equal(forward(hf_io.load(fused_dir), *causal_inputs(tokens)),
                                forward(hf_io.load(hf_dir), *causal_inputs(tokens)))
