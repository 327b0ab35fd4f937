"""Token-in-token-out prompt construction, incremental per rollout.

A harness echoes the model's earlier turns back in later requests, often altered: tool-call ids
rewritten (`call_abc` -> `callabc`), arguments re-serialised, thinking dropped. Re-tokenising that text
would train on ids the model never sampled. `PromptBuilder` instead recognises an echoed turn by its
parsed content (`templates.turn_match_key`) and splices in the exact ids the engine sampled; a turn it
cannot match is rendered by the template and counted as drift.

Cost per call grows with the new messages only: the ids of every block already seen are cached in a
trie keyed by block keys (exact values, compared by equality), so a call re-tokenises only the blocks
after its longest cached prefix; what remains per call is hashing the request's text, far cheaper than
tokenising it. Several cached prefixes coexist, so interleaved main-agent and subagent calls of one
rollout both stay cheap. Blocks start at `<|im_start|>`, so per-block ids concatenate to exactly
the ids of the whole text (tested).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from clawjax.text.messages import Message, ParsedTurn, ToolSpec
from clawjax.text.templates import Block, ChatTemplate, turn_match_key


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One request's prompt.

  `spliced_turns`/`drifted_turns` count the request's assistant turns that got their sampled ids back
  / had to be re-rendered; `new_tokens` is how many ids were not reused from an earlier call's cache;
  the last `generation_prompt_len` ids open the assistant turn to generate.
  """
  input_ids: list[int]
  spliced_turns: int
  drifted_turns: int
  new_tokens: int
  generation_prompt_len: int


@dataclasses.dataclass(frozen=True)
class _Generation:
  opening_ids: tuple[int, ...]   # the generation prompt the turn was sampled after
  output_ids: tuple[int, ...]
  prompt_len: int                # len(input_ids) of the call that sampled it


@dataclasses.dataclass(frozen=True)
class _CachedBlock:
  node: int                      # this block's trie node: the parent of the blocks that follow it
  ids: tuple[int, ...]
  spliced: bool | None           # None: not an assistant turn


class PromptBuilder:
  """Builds prompts for one rollout (create one per rollout; it remembers that rollout's turns)."""

  def __init__(self, template: ChatTemplate, *, enable_thinking: bool | None = None):
    self.template = template
    self.enable_thinking = enable_thinking
    self._generations: dict[tuple, list[_Generation]] = {}
    self._trie: dict[tuple[int, tuple], _CachedBlock] = {}  # (parent node, block key) -> block
    self._opening: dict[bool | None, list[int]] = {}

  def build(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
            enable_thinking: bool | None = None) -> Prompt:
    """Prompt ids for `messages` (+ the generation prompt), splicing this rollout's sampled turns.

    `enable_thinking` overrides the builder's default for this call (None: keep it).
    """
    thinking = self.enable_thinking if enable_thinking is None else enable_thinking
    ids: list[int] = []
    spliced = drifted = reused = 0
    node = 0  # the root
    for block in self.template.blocks(messages, tools):
      entry = self._trie.get((node, block.key))
      if entry is None:
        block_ids, block_spliced = self._render(block, len(ids))
        entry = _CachedBlock(len(self._trie) + 1, block_ids, block_spliced)
        self._trie[(node, block.key)] = entry
      else:
        reused += len(entry.ids)
      node = entry.node
      ids.extend(entry.ids)
      spliced += entry.spliced is True
      drifted += entry.spliced is False
    if thinking not in self._opening:
      self._opening[thinking] = self.template.tokenizer.encode(self.template.generation_prompt(thinking))
    opening = self._opening[thinking]
    ids.extend(opening)
    return Prompt(ids, spliced, drifted, len(ids) - reused, len(opening))

  def record_generation(self, prompt: Prompt, output_ids: Sequence[int], parsed_turn: ParsedTurn) -> None:
    """Remember a turn this rollout's model sampled after `prompt`, for later splicing."""
    key = turn_match_key(parsed_turn.text, parsed_turn.tool_calls)
    opening = tuple(prompt.input_ids[len(prompt.input_ids) - prompt.generation_prompt_len:])
    self._generations.setdefault(key, []).append(
        _Generation(opening, tuple(output_ids), len(prompt.input_ids)))

  def _render(self, block: Block, offset: int) -> tuple[tuple[int, ...], bool | None]:
    """A block's ids and whether they were spliced (None: not an assistant turn): the sampled ids of
    a matching generation, else the template's rendering."""
    m = block.assistant
    if m is not None:
      candidates = self._generations.get(self.template.echo_key(m))
      if candidates:
        # The same content may have been sampled more than once: prefer the turn sampled at this very
        # position of the conversation, else the latest.
        gen = next((g for g in reversed(candidates) if g.prompt_len == offset + len(g.opening_ids)),
                   candidates[-1])
        return gen.opening_ids + gen.output_ids + self._closing(gen.output_ids), True
    return self.template.block_ids(block), None if m is None else False

  def _closing(self, output_ids: tuple[int, ...]) -> tuple[int, ...]:
    """What ends a sampled turn in the transcript: the separator after its stop token, or the whole
    turn end when the sample was cut off (max tokens) before one."""
    t = self.template
    return t.after_stop_ids if output_ids and output_ids[-1] in t.stop_token_ids else t.turn_end_ids
