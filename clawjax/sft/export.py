"""The trained policy as a Hugging Face directory: config.json, safetensors and the tokenizer files, what
`train.py --config.model.init=DIR`, the embedded engine, SGLang, vLLM and transformers load.

The tokenizer files come from the model it started from when that is a directory (clawjax.models.hf_io
SIDE_FILES); a preset's tokenizer is written from the chat template's own tokenizer (tokenizer.json,
and a tokenizer_config.json naming its special tokens), so the directory renders with the same
template: the chat family follows from config.json's model_type.

A model spread over several processes (a multi-process SFT run) is exported by all of them together,
each tensor gathered once and written by one process (`hf_io.save`); process 0 writes the rest and
renames the directory into place.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

from clawjax import distributed
from clawjax.models import hf_io
from clawjax.models.model import Decoder
from clawjax.text.templates import IM_END, ChatTemplate


def export_model(model: Decoder, out_dir: str | os.PathLike, *, init: str, template: ChatTemplate) -> pathlib.Path:
  """Writes `model` into `out_dir` (whole, or not at all: it is written aside and then renamed over any
  older export); returns the directory. With several processes every process calls it, with the same
  `out_dir` on a filesystem they all see."""
  out = pathlib.Path(out_dir)
  tmp = out.with_name(f".{out.name}.partial")
  primary = distributed.is_primary()
  if primary:
    shutil.rmtree(tmp, ignore_errors=True)
  distributed.sync("sft export: cleared")
  source = pathlib.Path(init)
  hf_io.save(model, tmp, copy_files_from=source if source.is_dir() else None)
  if primary:
    _finish(model, tmp, out, template)
  distributed.sync("sft export: in place")
  return out


def _finish(model: Decoder, tmp: pathlib.Path, out: pathlib.Path, template: ChatTemplate) -> None:
  """Adds the tokenizer files a preset lacks to the written `tmp`, then renames it over `out`."""
  if not (tmp / "tokenizer.json").exists():
    template.tokenizer.hf.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": IM_END, "pad_token": IM_END,
        "clean_up_tokenization_spaces": False, "model_max_length": model.cfg.max_position_embeddings,
    }, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": model.cfg.bos_token_id, "eos_token_id": model.cfg.eos_token_id}, indent=2) + "\n")
  old = out.with_name(f".{out.name}.old")
  shutil.rmtree(old, ignore_errors=True)
  if out.exists():
    out.rename(old)
  tmp.rename(out)
  shutil.rmtree(old, ignore_errors=True)
