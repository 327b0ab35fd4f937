"""ModelConfig: one dataclass for the decoder family (Llama, Qwen3 dense, Qwen3-MoE), HF config I/O, presets.

The architecture fields mirror the Hugging Face `config.json` keys (mapping in `from_hf_config`); the
run-time fields (dtypes, attention implementation, remat) are ours: only param_dtype reaches config.json
(as torch_dtype), and loading takes them as keyword overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
from typing import Any

import jax.numpy as jnp

# HF `model_type` -> (architectures entry, whether q/k RMSNorm is part of the architecture).
_FAMILIES = {
    "llama": ("LlamaForCausalLM", False),
    "qwen3": ("Qwen3ForCausalLM", True),
    "qwen3_moe": ("Qwen3MoeForCausalLM", True),
}


# The `jax.checkpoint_policies` that are policies as they stand (the others are factories taking names).
REMAT_POLICIES = ("nothing_saveable", "everything_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture plus run-time knobs of a `Decoder`.

  Attributes:
    family: HF model_type: "llama", "qwen3" or "qwen3_moe" (decides export names and qk_norm default).
    vocab_size, d_model, n_layers, n_heads, n_kv_heads, head_dim, mlp_dim: the usual sizes; mlp_dim is
      the dense SwiGLU width (HF intermediate_size).
    rope_theta: RoPE base. rms_eps: RMSNorm epsilon. tie_embeddings: lm_head shares the embedding.
    qk_norm: Qwen3's per-head RMSNorm on q and k before RoPE.
    n_experts, top_k, moe_mlp_dim, norm_topk_prob: Qwen3-MoE router and expert sizes (n_experts=0: dense).
      The experts run as grouped matmuls (clawjax/kernels/grouped_matmul/), split over the mesh's
      `expert` axis when it is > 1 (`clawjax.sharding.MeshConfig` says when to set it).
    moe_layer_step, mlp_only_layers: which layers are MoE (HF decoder_sparse_step / mlp_only_layers).
    max_position_embeddings, bos_token_id, eos_token_id: carried through HF configs only.
    dtype: compute dtype of activations. param_dtype: storage dtype of parameters.
    attention_impl: a kernel registered in clawjax/kernels/tree_attention/: "dense" (reference, materialises
      [T, T] scores on device), "blocked" (online softmax over key blocks, memory O(T * attention_block))
      or "pallas" (the same as a block-sparse Pallas kernel, chosen when the step is lowered: Mosaic on
      TPU, Triton on a CUDA GPU, interpret mode elsewhere; a config runs unchanged on either).
    attention_block: query/key block length of the blocked and pallas kernels (default 512: large enough to keep
      matmuls efficient, small enough that 64K-token rows fit; not a published value). On a CUDA GPU the
      pallas kernel tiles at min(attention_block, 64) rounded down to a power of two (Triton tiles are
      register-sized; clawjax/kernels/tree_attention/triton_gpu.py says why 64).
    remat: recompute each layer's activations in the backward pass (saves memory, costs ~1/3 more FLOPs).
    remat_policy: with remat, the `jax.checkpoint_policies` entry that says which of a layer's
      intermediates are saved rather than recomputed (one of REMAT_POLICIES). Default "nothing_saveable":
      only the layer's inputs are kept, the least memory; "dots_with_no_batch_dims_saveable" keeps the
      weight matmuls' outputs (more memory, less recomputation).
  """
  family: str
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  rms_eps: float = 1e-6
  tie_embeddings: bool = False
  qk_norm: bool = False
  n_experts: int = 0
  top_k: int = 0
  moe_mlp_dim: int = 0
  norm_topk_prob: bool = True
  moe_layer_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  max_position_embeddings: int = 32_768
  bos_token_id: int | None = None
  eos_token_id: int | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  attention_impl: str = "dense"
  attention_block: int = 512
  remat: bool = False
  remat_policy: str = "nothing_saveable"

  def __post_init__(self):
    if self.family not in _FAMILIES:
      raise ValueError(f"ModelConfig.family={self.family!r}: expected one of {sorted(_FAMILIES)}")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(f"ModelConfig: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
    if self.n_experts and not (0 < self.top_k <= self.n_experts and self.moe_mlp_dim > 0):
      raise ValueError(f"ModelConfig: MoE needs 0 < top_k <= n_experts and moe_mlp_dim > 0, got top_k="
                       f"{self.top_k}, n_experts={self.n_experts}, moe_mlp_dim={self.moe_mlp_dim}")
    for name in ("dtype", "param_dtype"):
      jnp.dtype(getattr(self, name))  # fails early on a typo
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"ModelConfig.remat_policy={self.remat_policy!r}: expected one of {REMAT_POLICIES}")

  def replace(self, **changes: Any) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  def is_moe_layer(self, layer: int) -> bool:
    """HF Qwen3-MoE's rule for which layers use the sparse block."""
    return (self.n_experts > 0 and layer not in self.mlp_only_layers
            and (layer + 1) % self.moe_layer_step == 0)

  @classmethod
  def from_hf_config(cls, hf: dict[str, Any], **runtime: Any) -> ModelConfig:
    """Reads a HF config.json dict; `runtime` sets our own fields (dtype, attention_impl, ...)."""
    family = hf.get("model_type")
    if family not in _FAMILIES:
      raise ValueError(f"config.json: model_type={family!r} is not supported (expected one of {sorted(_FAMILIES)})")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
      raise ValueError(f"config.json: rope scaling {rope} is not supported (only plain RoPE)")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
      raise ValueError("config.json: attention_bias/mlp_bias=true is not supported by this decoder family")
    n_heads = hf["num_attention_heads"]
    n_experts = hf.get("num_experts", hf.get("num_local_experts", 0)) if family == "qwen3_moe" else 0
    return cls(
        family=family,
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        mlp_dim=hf["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0))),
        rms_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", False),
        qk_norm=_FAMILIES[family][1],
        n_experts=n_experts,
        top_k=hf.get("num_experts_per_tok", 0) if n_experts else 0,
        moe_mlp_dim=hf.get("moe_intermediate_size", 0) if n_experts else 0,
        norm_topk_prob=hf.get("norm_topk_prob", True),
        moe_layer_step=hf.get("decoder_sparse_step", 1),
        mlp_only_layers=tuple(hf.get("mlp_only_layers", ())),
        max_position_embeddings=hf.get("max_position_embeddings", 32_768),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=hf.get("eos_token_id"),
        **runtime,
    )

  def to_hf_config(self) -> dict[str, Any]:
    """The config.json dict transformers / vLLM / SGLang read for this architecture."""
    if self.qk_norm != _FAMILIES[self.family][1]:
      raise ValueError(f"ModelConfig: qk_norm={self.qk_norm} cannot be expressed as a HF {self.family} config")
    hf = {
        "architectures": [_FAMILIES[self.family][0]],
        "model_type": self.family,
        "vocab_size": self.vocab_size,
        "hidden_size": self.d_model,
        "num_hidden_layers": self.n_layers,
        "num_attention_heads": self.n_heads,
        "num_key_value_heads": self.n_kv_heads,
        "head_dim": self.head_dim,
        "intermediate_size": self.mlp_dim,
        "hidden_act": "silu",
        "rope_theta": self.rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": self.rms_eps,
        "tie_word_embeddings": self.tie_embeddings,
        "attention_bias": False,
        "max_position_embeddings": self.max_position_embeddings,
        "bos_token_id": self.bos_token_id,
        "eos_token_id": self.eos_token_id,
        "torch_dtype": self.param_dtype,
    }
    if self.family == "llama":
      hf["mlp_bias"] = False
    if self.family == "qwen3_moe":
      hf.update(num_experts=self.n_experts, num_experts_per_tok=self.top_k,
                moe_intermediate_size=self.moe_mlp_dim, norm_topk_prob=self.norm_topk_prob,
                decoder_sparse_step=self.moe_layer_step, mlp_only_layers=list(self.mlp_only_layers))
    return hf


QWEN3_VOCAB = 151_936  # Qwen3's embedding rows (151,643 BPE ranks + specials, padded)

# Published HF config.json values (HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen3-0.6B, Qwen/Qwen3-8B,
# Qwen/Qwen3-30B-A3B). The "test-*" presets are ours: Qwen3 architecture at toy sizes.
PRESETS: dict[str, ModelConfig] = {
    "test-tiny": ModelConfig(
        family="qwen3", vocab_size=QWEN3_VOCAB, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
        head_dim=16, mlp_dim=128, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=40_960, bos_token_id=151_643, eos_token_id=151_645),
    "test-tiny-vocab": ModelConfig(
        family="qwen3", vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
        mlp_dim=128, rope_theta=1_000_000.0, qk_norm=True),
    "test-tiny-moe": ModelConfig(
        family="qwen3_moe", vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
        mlp_dim=128, rope_theta=1_000_000.0, qk_norm=True, n_experts=8, top_k=2, moe_mlp_dim=32),
    "smollm2-135m": ModelConfig(
        family="llama", vocab_size=49_152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
        mlp_dim=1536, rope_theta=100_000.0, rms_eps=1e-5, tie_embeddings=True,
        max_position_embeddings=8192, bos_token_id=1, eos_token_id=2),
    "qwen3-0.6b": ModelConfig(
        family="qwen3", vocab_size=QWEN3_VOCAB, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
        head_dim=128, mlp_dim=3072, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True,
        max_position_embeddings=40_960, bos_token_id=151_643, eos_token_id=151_645),
    "qwen3-8b": ModelConfig(
        family="qwen3", vocab_size=QWEN3_VOCAB, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8,
        head_dim=128, mlp_dim=12_288, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
        max_position_embeddings=40_960, bos_token_id=151_643, eos_token_id=151_645),
    "qwen3-30b-a3b": ModelConfig(
        family="qwen3_moe", vocab_size=QWEN3_VOCAB, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4,
        head_dim=128, mlp_dim=6144, rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=False,
        n_experts=128, top_k=8, moe_mlp_dim=768, norm_topk_prob=True,
        max_position_embeddings=40_960, bos_token_id=151_643, eos_token_id=151_645),
}


def unknown_model(spec: str) -> str | None:
  """Why `spec` names no model to load, with the closest preset names; None when it is a preset or a
  Hugging Face directory (one with config.json)."""
  if spec in PRESETS or (pathlib.Path(spec) / "config.json").is_file():
    return None
  close = difflib.get_close_matches(spec, list(PRESETS), n=3, cutoff=0.6)
  hint = f"did you mean {', '.join(close)}?" if close else f"the presets: {', '.join(PRESETS)}"
  return f"{spec!r} is neither a preset nor a directory with config.json; {hint}"


def preset(name: str, **runtime: Any) -> ModelConfig:
  """A preset by name, with run-time fields (dtype, attention_impl, ...) overridden."""
  if name not in PRESETS:
    raise KeyError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name].replace(**runtime)
