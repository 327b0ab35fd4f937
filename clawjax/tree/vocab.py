"""Token ids the model can read: those in [0, vocab_size).

An id past the model's vocabulary indexes past its embedding table: the loss and the gradient come out
NaN, the update is skipped, and the cause never shows. Such ids come from data tokenized for another
model (an engine serving another model than the learner trains, SFT data rendered with another
tokenizer), so the learner's data is checked before it sees it: RL rollouts (clawjax.train.step_data)
and SFT trees (clawjax.sft).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from clawjax.tree.build import CallArrays, CallTree


class VocabularyError(ValueError):
  """Data whose ids the model cannot read; the message is one line naming a call or record, the id and
  the vocabulary size."""


def outside(ids: np.ndarray, vocab_size: int) -> int | None:
  """The first id of `ids` outside [0, vocab_size), or None (two reductions when all are inside)."""
  if not ids.size or (ids.min() >= 0 and ids.max() < vocab_size):
    return None
  return int(ids[np.flatnonzero((ids < 0) | (ids >= vocab_size))[0]])


def call_outside(arrays: Mapping[int, CallArrays], vocab_size: int) -> tuple[int, int] | None:
  """(call_index, id) of the first call (in call order) whose input or output holds an id outside the
  vocabulary; `arrays` are the calls' `clawjax.tree.build.call_arrays`."""
  for index in sorted(arrays):
    bad = outside(arrays[index][0], vocab_size)
    if bad is not None:
      return index, bad
  return None


def tree_outside(trees: Iterable[CallTree], vocab_size: int) -> tuple[CallTree, int] | None:
  """(tree, id) of the first tree holding an id outside the vocabulary."""
  for tree in trees:
    bad = outside(tree.tokens_T, vocab_size)
    if bad is not None:
      return tree, bad
  return None


def mismatch(where: str, token: int, vocab_size: int) -> str:
  """The one-line reason an id cannot be read."""
  return f"{where}: token id {token} is outside the model's vocabulary [0, {vocab_size})"


def refuse_trees(trees: Iterable[CallTree], vocab_size: int) -> None:
  """A VocabularyError naming the first tree (its rollout id: the record it came from) that holds an id
  outside the vocabulary: training data (SFT) is refused whole, as it was tokenized for another model."""
  found = tree_outside(trees, vocab_size)
  if found:
    tree, token = found
    raise VocabularyError(f"{mismatch(tree.rollout_id, token, vocab_size)}: the data was tokenized for another "
                          "model than model.init (another tokenizer or chat template)")
