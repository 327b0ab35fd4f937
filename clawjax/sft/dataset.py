"""Every source of a `DataConfig` -> prefix trees of trained tokens, within the length limit, counted.

Conversations (OpenAI or Anthropic JSONL) are rendered as the shim would record them (render.py) into
one-path trees; a run's rollouts (RFT) are filtered as RL filters them (clawjax.tree.filters) into
their trees of kept calls. A tree longer than `max_len` is cut after the last call that fits or
dropped (`overlong`). Counts (in the run's summary): conversations, no_assistant_turn, whole, cut,
dropped, bad_lines; rollouts, rollouts_not_ok, rollouts_below_min_score, rollouts_without_calls,
rollouts_nothing_trained, rollouts_trained, bad_records.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import numpy as np

from clawjax.sft.config import ROLLOUT_FILES, DataConfig, SFTRunConfig
from clawjax.sft.data import Counts, DataError, FormatError, read_conversations, read_rollouts
from clawjax.sft.render import conversation_tree, fit_tree, render_calls
from clawjax.text.templates import ChatTemplate
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout

log = logging.getLogger(__name__)


def _conversation_trees(fmt: str, path: str, template: ChatTemplate, cfg: SFTRunConfig,
                        counts: Counts) -> Iterator[tuple[CallTree | None, str]]:
  for conv in read_conversations(path, fmt, bad_lines=cfg.bad_lines, counts=counts, tools_file=cfg.tools_file):
    counts["conversations"] += 1
    try:
      calls = render_calls(template, conv.messages, conv.tools, rollout_id=conv.where,
                           enable_thinking=cfg.enable_thinking)
    except FormatError:
      raise
    except DataError as e:
      if cfg.bad_lines == "stop":
        raise
      counts["bad_lines"] += 1
      log.warning("skipped %s", e)
      continue
    if not calls:
      counts["no_assistant_turn"] += 1
      continue
    yield conversation_tree(conv.where, calls, cfg.max_len, cfg.overlong)


def rollout_trees(run_dir: str, *, min_score: float, max_len: int, overlong: str, counts: Counts,
                  filters: FilterConfig = FilterConfig(), bad_lines: str = "stop",
                  rollout_files: Sequence[str] = ROLLOUT_FILES) -> Iterator[tuple[CallTree | None, str]]:
  """(tree, "whole" | "cut" | "dropped") of each rollout of a run directory that is ok and scored >=
  min_score: its calls filtered as RL filters them, cut or dropped to `max_len`."""
  for rid, calls in read_rollouts(run_dir, min_score=min_score, rollout_files=rollout_files,
                                  bad_lines=bad_lines, counts=counts):
    trained = filter_rollout(rid, calls, filters).trained
    if not trained:
      counts["rollouts_nothing_trained"] += 1
      continue
    counts["rollouts_trained"] += 1
    yield fit_tree(f"{run_dir}:{rid}", trained, max_len, overlong)


def load_trees(data: DataConfig, template: ChatTemplate, cfg: SFTRunConfig, counts: Counts) -> list[CallTree]:
  """The trees of every source of `data`, in source order; `counts` gets what was read and left out."""
  trees: list[CallTree] = []
  for fmt, path in data.paths():
    found = rollout_trees(
        path, min_score=cfg.min_score, max_len=cfg.max_len, overlong=cfg.overlong, counts=counts,
        filters=cfg.filters, bad_lines=cfg.bad_lines, rollout_files=cfg.rollout_files,
    ) if fmt == "calls" else _conversation_trees(fmt, path, template, cfg, counts)
    for tree, how in found:
      counts[how] += 1
      if tree is not None:
        trees.append(tree)
  seen: set[str] = set()
  for t in trees:
    if t.rollout_id in seen:
      raise DataError(f"{t.rollout_id}: read twice (is a source listed twice?)")
    seen.add(t.rollout_id)
  return trees


def split_heldout(trees: list[CallTree], fraction: float, seed: int) -> tuple[list[CallTree], list[CallTree]]:
  """(train, held-out): a seeded choice of round(fraction x n) trees held out (at least one when
  fraction > 0 and there are two or more)."""
  n_out = min(max(round(fraction * len(trees)), 1 if fraction > 0 else 0), max(len(trees) - 1, 0))
  out = set(np.random.default_rng([seed, 1]).permutation(len(trees))[:n_out].tolist())
  return [t for i, t in enumerate(trees) if i not in out], [t for i, t in enumerate(trees) if i in out]
