"""The text side of the model presets: which tokenizer each preset's vocabulary is, by the name
`clawjax.text.load_tokenizer` / `load_template` know it (the chat family follows from that name).

The text layer knows tokenizers and templates, not presets: whoever takes a model that may be a preset
(the shim's `--model`, a run config's `model.init`) passes
`text_source(model)` to `load_template`. JAX-free, so the shim resolves a preset without importing JAX.
"""

from __future__ import annotations

# Preset name (clawjax.models.config.PRESETS) -> tokenizer name; None: a toy vocabulary no tokenizer has.
PRESET_TOKENIZERS: dict[str, str | None] = {
    "test-tiny": "qwen3",  # Qwen3's whole vocabulary at a toy size
    "test-tiny-vocab": None,
    "test-tiny-moe": None,
    "smollm2-135m": "smollm2",
    "qwen3-0.6b": "qwen3",
    "qwen3-8b": "qwen3",
    "qwen3-30b-a3b": "qwen3",
}


def text_source(model: str) -> str:
  """What `load_tokenizer` / `load_template` take for `model`: a preset's tokenizer name; anything else
  (a tokenizer name, an HF model dir) as it is."""
  if model not in PRESET_TOKENIZERS:
    return model
  tokenizer = PRESET_TOKENIZERS[model]
  if tokenizer is None:
    raise ValueError(f"model preset {model!r} has a toy vocabulary that no tokenizer has; name the "
                     "template's tokenizer ('qwen3', 'smollm2') or a model dir with a tokenizer.json")
  return tokenizer
