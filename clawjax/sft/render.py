"""A conversation -> the calls the shim would record for it, and those calls -> one prefix tree.

The shim renders a harness's request with the model's chat template through a per-rollout
`PromptBuilder`, and splices the ids the model sampled back in when the harness echoes a turn. Replaying
a conversation through the shim therefore records, for its k-th assistant turn, one call whose input is
the prompt built from the messages before that turn and whose output is the turn as the model writes it
(`ChatTemplate.assistant_body`, then the end-of-turn token). `render_calls` builds exactly those calls
with the same template and builder, so the ids SFT trains on are the ids the shim would record at RL time
(tests/sft/test_token_identity.py replays conversations through the shim with the official SDKs).

The tree of a conversation's calls (clawjax.tree.build) is one path whose trained tokens are the
assistant turns (text, thinking shown, tool calls, end-of-turn token); everything else (system prompt,
tools, user turns, tool results, the assistant header) is context. Call-log trees (RFT) are the same kind
of tree, so every source is packed and trained by the same code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from clawjax.calllog import CallRecord
from clawjax.sft.data import DataError
from clawjax.text.messages import Message, ToolSpec
from clawjax.text.prompt import PromptBuilder
from clawjax.text.templates import ChatTemplate
from clawjax.text.turn_stream import split_thinking
from clawjax.tree.build import CallTree, build_tree


def assistant_output_ids(template: ChatTemplate, m: Message) -> list[int]:
  """The ids a model of the template's family samples for the assistant turn `m` (thinking shown when it
  has any, text, tool calls), end-of-turn token included. The conversation's text is encoded as text:
  only the template's own markup becomes control tokens."""
  thinking, content = m.thinking, m.content
  if thinking is None and template.format.thinking:
    thinking, content = split_thinking(content)  # thinking written inline, as some datasets do
  turn = dataclasses.replace(m, thinking=thinking, content=content)
  body = template.assistant_body(turn, show_thinking=thinking is not None)
  return template.tokenizer.encode_markup(body) + [template.stop_token_ids[0]]


def render_calls(template: ChatTemplate, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
                 rollout_id: str, enable_thinking: bool | None = None) -> list[CallRecord]:
  """One call per assistant turn, as the shim would record the conversation; messages after the last
  assistant turn are not part of any call. A turn the template cannot read back as written (tool-call
  arguments that are not a JSON object) would not splice when echoed: a DataError naming it."""
  builder = PromptBuilder(template)
  calls: list[CallRecord] = []
  history: list[int] = []
  for i, m in enumerate(messages):
    if m.role != "assistant":
      continue
    prompt = builder.build(messages[:i], tools, enable_thinking=enable_thinking)
    if prompt.drifted_turns or prompt.input_ids[:len(history)] != history:
      raise DataError(f"{rollout_id}: an assistant turn before turn {len(calls)} does not read back through the "
                      f"{template.family} template as written (tool-call arguments must be a JSON object)")
    output = assistant_output_ids(template, m)
    builder.record_generation(prompt, output, template.parse(output))
    calls.append(CallRecord(
        rollout_id=rollout_id, task_id=rollout_id, harness="sft", call_index=len(calls), status="ok",
        input_ids=tuple(prompt.input_ids), output_ids=tuple(output), output_logprobs=(0.0,) * len(output),
        role="main", finish_reason="stop", model="", t_start=0.0, t_end=0.0))
    history = prompt.input_ids + output
  return calls


def conversation_tree(rollout_id: str, calls: Sequence[CallRecord], max_len: int, overlong: str
                      ) -> tuple[CallTree | None, str]:
  """The one-path tree of a conversation's calls (each extends the one before: `render_calls`), within
  `max_len` tokens, and what it took (as `fit_tree`). Equal to `build_tree` of the calls, but its depth,
  parent and weight arrays are views of one array or of a scalar: a large SFT set holds ~12 bytes a
  token."""
  ends = [len(c.input_ids) + len(c.output_ids) for c in calls]
  keep = len(calls) if ends[-1] <= max_len else (
      sum(e <= max_len for e in ends) if overlong == "cut" else 0)
  if keep == 0:
    return None, "dropped"
  last = calls[keep - 1]
  tokens = np.array(last.input_ids + last.output_ids, np.int32)
  n = len(tokens)
  owner = np.full(n, -1, np.int32)
  for c in calls[:keep]:
    owner[len(c.input_ids):len(c.input_ids) + len(c.output_ids)] = c.call_index
  positions = np.arange(-1, n, dtype=np.int32)  # its slices are the depth and the parent of each token
  tree = CallTree(rollout_id=rollout_id, tokens_T=tokens, depth_T=positions[1:n + 1],
                  parent_T=positions[:n], subtree_end_T=np.broadcast_to(np.int32(n), (n,)), owner_T=owner,
                  logprobs_T=np.broadcast_to(np.float32(0), (n,)), paths_T=np.broadcast_to(np.int32(1), (n,)),
                  node_start_K=np.zeros(1, np.int32), node_end_K=np.full(1, n, np.int32),
                  node_parent_K=np.full(1, -1, np.int32), leaves_L=np.zeros(1, np.int32))
  return tree, "whole" if keep == len(calls) else "cut"


def fit_tree(rollout_id: str, calls: Sequence[CallRecord], max_len: int, overlong: str
             ) -> tuple[CallTree | None, str]:
  """The tree of `calls` (a rollout's trained calls) within `max_len` tokens, and what it took:
  "whole"; "cut", the tree of the longest run of first calls that fits (with `overlong="cut"`: a cut at
  an assistant turn's end); or (None, "dropped")."""
  calls = sorted(calls, key=lambda c: c.call_index)
  tree = build_tree(rollout_id, calls)
  if tree.size <= max_len:
    return tree, "whole"
  best, lo, hi = None, 0, len(calls) - 1
  while overlong == "cut" and lo < hi:  # the tree only grows with more calls: bisect the count
    mid = (lo + hi + 1) // 2
    trial = build_tree(rollout_id, calls[:mid])
    if trial.size <= max_len:
      best, lo = trial, mid
    else:
      hi = mid - 1
  return (best, "cut") if best is not None else (None, "dropped")
