"""Which tokenizer each model preset's vocabulary is: every preset is listed, and each named tokenizer
fits its preset (the same family of chat template, no more ids than the model has rows for)."""
import pytest

from clawjax.models.config import PRESETS
from clawjax.models.vocab import PRESET_TOKENIZERS, text_source
from clawjax.text.templates import load_template


def test_every_preset_is_listed():
  assert set(PRESET_TOKENIZERS) == set(PRESETS)


@pytest.mark.parametrize("preset", sorted(k for k, v in PRESET_TOKENIZERS.items() if v is not None))
def test_a_presets_tokenizer_fits_its_vocabulary_and_family(preset):
  template = load_template(text_source(preset))
  assert template.tokenizer.vocab_size <= PRESETS[preset].vocab_size
  assert template.family == ("qwen3" if PRESETS[preset].family.startswith("qwen") else "chatml")


def test_toy_vocabularies_have_no_tokenizer_and_other_names_pass_through(tmp_path):
  qwen3 = load_template("qwen3").tokenizer
  for preset in (k for k, v in PRESET_TOKENIZERS.items() if v is None):
    assert PRESETS[preset].vocab_size < qwen3.vocab_size
    with pytest.raises(ValueError, match=preset):
      text_source(preset)
  assert [text_source(m) for m in ("qwen3", "smollm2", str(tmp_path))] == ["qwen3", "smollm2", str(tmp_path)]
  # `--model test-tiny` (a Qwen3 preset with the full vocabulary) gets the Qwen3 template and tokenizer.
  tiny = load_template(text_source("test-tiny"))
  assert tiny.family == "qwen3"
  assert tiny.tokenizer.encode("You are a helpful assistant.") == [2610, 525, 264, 10950, 17847, 13]
