"""Chat templates: messages -> prompt token ids, and one sampled assistant turn -> `ParsedTurn`.

Two families, both ChatML (`<|im_start|>role\\n...<|im_end|>\\n` blocks), written from the formats'
documentation:

* "qwen3": Qwen3's documented chat format. Tools go into the system block as one JSON object per line
  inside `<tools></tools>`; an assistant's tool calls are `<tool_call>\\n{"name": N, "arguments": A}\\n
  </tool_call>`; tool results are user blocks of `<tool_response>` sections, consecutive tool messages
  sharing one block; an assistant turn shows its `<think>` block only when it comes after the last real
  user query (earlier turns' thinking is dropped); `enable_thinking=False` opens the generation with an
  empty think block.
* "chatml": SmolLM2-Instruct's template (its default system prompt when the conversation has none) with
  tools added in the same `<tool_call>` JSON convention, described in plain words in the system block
  (CHATML_TOOLS_INTRO) so a small model can learn the format. It has no thinking.

A prompt is a sequence of `Block`s, each starting with `<|im_start|>`: an added token, so tokenising
blocks one by one gives the same ids as tokenising the whole text (BPE never merges across it). The
prompt builder caches ids per block on that basis.

A block is rendered as `Markup`: the template's own text, whose control tokens become their ids, and the
conversation's content (messages, tool results, tool calls' names and arguments, tool names,
descriptions and schemas), which is always plain text, whatever added tokens it spells out.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from collections.abc import Sequence
from typing import Literal

from clawjax.text.messages import Message, ParsedTurn, ToolCall, ToolSpec, canonical_arguments
from clawjax.text.tokenizer import Markup, Tokenizer, load_tokenizer, model_type
from clawjax.text.turn_stream import (CALL_CLOSE, CALL_OPEN, THINK_CLOSE, THINK_OPEN, TurnStream,
                                      split_thinking)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

QWEN3_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
QWEN3_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>")
CHATML_TOOLS_INTRO = "You can use these tools (one JSON description per line):\n<tools>"
CHATML_TOOLS_OUTRO = (
    "\n</tools>\nTo use a tool, reply with one block per call:\n<tool_call>\n"
    "{\"name\": \"<tool name>\", \"arguments\": {<arguments as JSON>}}\n</tool_call>")
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

@dataclasses.dataclass(frozen=True)
class FamilyFormat:
  """What distinguishes one ChatML family from another."""
  tools_intro: str
  tools_outro: str
  compact_tool_json: bool        # chatml: compact tool schemas (shorter for small models)
  default_system: str | None     # system block used when the conversation starts without one
  thinking: bool                 # the family has <think> blocks
  enable_thinking_default: bool


FAMILIES: dict[str, FamilyFormat] = {
    "qwen3": FamilyFormat(QWEN3_TOOLS_INTRO, QWEN3_TOOLS_OUTRO, compact_tool_json=False,
                          default_system=None, thinking=True, enable_thinking_default=True),
    "chatml": FamilyFormat(CHATML_TOOLS_INTRO, CHATML_TOOLS_OUTRO, compact_tool_json=True,
                           default_system=SMOLLM2_DEFAULT_SYSTEM, thinking=False,
                           enable_thinking_default=False),
}


@dataclasses.dataclass(frozen=True)
class Block:
  """One ChatML block of a prompt: the unit of caching and of splicing.

  `key` is a hashable value that determines the block's text exactly (compared by equality, so equal
  keys can never render differently); `messages` are the messages it renders (several for grouped tool
  results; none for a system block made only of the default prompt and tools).
  """
  key: tuple
  kind: Literal["system", "message", "tools_results"]
  messages: tuple[Message, ...]
  show_thinking: bool = False
  tools: tuple[ToolSpec, ...] = ()

  @property
  def assistant(self) -> Message | None:
    """The assistant message of an assistant block, else None."""
    m = self.messages
    return m[0] if self.kind == "message" and m[0].role == "assistant" else None


def turn_match_key(text: str, tool_calls: Sequence[ToolCall]) -> tuple:
  """Identity of an assistant turn as a harness echoes it: visible text (outer whitespace ignored),
  tool names and parsed arguments in order. Ignores thinking, tool-call ids and argument formatting."""
  return (text.strip(), *((c.name, canonical_arguments(c.arguments)) for c in tool_calls))


def _calls_key(tool_calls: Sequence[ToolCall]) -> tuple:
  # repr, not canonical JSON: cheap, and exact for the rendering (which serialises the same value).
  return tuple((c.name, c.arguments if isinstance(c.arguments, str) else repr(c.arguments))
               for c in tool_calls)


class ChatTemplate:
  """One family's chat format over one tokenizer."""

  def __init__(self, family: str, tokenizer: Tokenizer, *, shared_cache_blocks: int = 4096):
    """`shared_cache_blocks`: how many rendered blocks' ids to keep across all rollouts (least
    recently used evicted). Rollouts of one task share their big system/tools/task blocks (~40K
    characters for Claude Code), which then tokenise once, not once per rollout."""
    if family not in FAMILIES:
      raise ValueError(f"ChatTemplate: unknown family {family!r}; known: {sorted(FAMILIES)}")
    self.family, self.tokenizer, self.format = family, tokenizer, FAMILIES[family]
    for token in (IM_START, IM_END):
      if not tokenizer.has_token(token):
        raise ValueError(f"ChatTemplate({family!r}): tokenizer {tokenizer.name!r} lacks {token}")
    ends = [IM_END] + [t for t in ("<|endoftext|>",) if tokenizer.has_token(t)]
    # Generation stops at any of these; im_end is the turn's normal end.
    self.stop_token_ids: tuple[int, ...] = tuple(tokenizer.token_id(t) for t in ends)
    self.turn_end_text = IM_END + "\n"
    self.turn_end_ids: tuple[int, ...] = tuple(tokenizer.encode(self.turn_end_text))
    # What follows a sampled turn that already ended with a stop token.
    self.after_stop_ids: tuple[int, ...] = tuple(tokenizer.encode("\n"))
    self.shared_cache_blocks = shared_cache_blocks
    self._block_ids: collections.OrderedDict[tuple, tuple[int, ...]] = collections.OrderedDict()
    self._tools_keys: collections.OrderedDict[tuple, tuple[tuple, tuple]] = collections.OrderedDict()

  # ---- rendering --------------------------------------------------------------------------------

  def resolve_thinking(self, enable_thinking: bool | None) -> bool:
    return self.format.enable_thinking_default if enable_thinking is None else enable_thinking

  def generation_prompt(self, enable_thinking: bool | None = None) -> str:
    """The text that opens the assistant turn the model is asked to generate."""
    text = IM_START + "assistant\n"
    if self.format.thinking and not self.resolve_thinking(enable_thinking):
      text += THINK_OPEN + "\n\n" + THINK_CLOSE + "\n\n"
    return text

  def tools_markup(self, tools: Sequence[ToolSpec]) -> Markup:
    """The tools section of the system block: one JSON object per line between the family's texts."""
    fmt = self.format
    seps = (",", ":") if fmt.compact_tool_json else None
    out = Markup(fmt.tools_intro)
    for t in tools:
      spec = {"name": t.name, "description": t.description, "parameters": t.parameters}
      if not fmt.compact_tool_json:
        spec = {"type": "function", "function": spec}
      out.template("\n").content(json.dumps(spec, ensure_ascii=False, separators=seps))
    return out.template(fmt.tools_outro)

  def blocks(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> list[Block]:
    """The prompt's blocks, cheap to compute: texts are only built by `block_markup`."""
    out: list[Block] = []
    tools = tuple(tools)
    start = 1 if messages and messages[0].role == "system" else 0
    if start or tools or self.format.default_system is not None:
      key = ("system", messages[0].content if start else None, self._tools_key(tools))
      out.append(Block(key, "system", tuple(messages[:start]), tools=tools))
    last_query = self._last_query_index(messages)
    i = start
    while i < len(messages):
      m = messages[i]
      if m.role == "tool":
        j = i
        while j < len(messages) and messages[j].role == "tool":
          j += 1
        group = tuple(messages[i:j])
        out.append(Block(("tools_results", *(t.content for t in group)), "tools_results", group))
        i = j
        continue
      if m.role == "assistant":
        thinking, _ = self._thinking_and_content(m)
        show = (self.format.thinking and i > last_query
                and (i == len(messages) - 1 or bool(thinking)))
        key = ("assistant", show, (thinking or "") if show else "", m.content, _calls_key(m.tool_calls))
        out.append(Block(key, "message", (m,), show_thinking=show))
      else:
        out.append(Block((m.role, m.content), "message", (m,)))
      i += 1
    return out

  def _tools_key(self, tools: tuple[ToolSpec, ...]) -> tuple:
    """The exact-value key of a tool list (repr of ~32K characters of schema for Claude Code), cached by
    the identity of the ToolSpec objects: the shim's per-rollout MessageMemo hands back the same objects
    while a harness resends the same tools. The cache holds the objects, so their ids stay unique."""
    ident = tuple(map(id, tools))
    hit = self._tools_keys.get(ident)
    if hit is not None:
      self._tools_keys.move_to_end(ident)
      return hit[1]
    key = tuple((t.name, t.description, repr(t.parameters)) for t in tools)
    self._tools_keys[ident] = (tools, key)
    if len(self._tools_keys) > self.shared_cache_blocks:
      self._tools_keys.popitem(last=False)
    return key

  def block_markup(self, block: Block) -> Markup:
    """A block's text, from `<|im_start|>` to the `<|im_end|>\\n` that closes it."""
    if block.kind == "system":
      out = Markup(IM_START + "system\n")
      if block.messages:
        out.content(block.messages[0].content)
      elif self.format.default_system is not None:
        out.template(self.format.default_system)
      if block.tools:
        if block.messages or self.format.default_system is not None:
          out.template("\n\n")
        out.extend(self.tools_markup(block.tools))
      return out.template(self.turn_end_text)
    if block.kind == "tools_results":
      out = Markup(IM_START + "user")
      for m in block.messages:
        out.template(f"\n{RESPONSE_OPEN}\n").content(m.content).template(f"\n{RESPONSE_CLOSE}")
      return out.template(self.turn_end_text)
    m = block.messages[0]
    if m.role != "assistant":
      return Markup(IM_START + m.role + "\n").content(m.content).template(self.turn_end_text)
    out = Markup(IM_START + "assistant\n").extend(self.assistant_body(m, block.show_thinking))
    return out.template(self.turn_end_text)

  def block_text(self, block: Block) -> str:
    return str(self.block_markup(block))

  def block_ids(self, block: Block) -> tuple[int, ...]:
    """A block's ids, from the shared cache or tokenised (its key determines its text exactly)."""
    ids = self._block_ids.get(block.key)
    if ids is None:
      ids = tuple(self.tokenizer.encode_markup(self.block_markup(block)))
      self._block_ids[block.key] = ids
      if len(self._block_ids) > self.shared_cache_blocks:
        self._block_ids.popitem(last=False)
    else:
      self._block_ids.move_to_end(block.key)
    return ids

  def assistant_body(self, m: Message, show_thinking: bool) -> Markup:
    """An assistant turn's text as the model writes it (between the opening line and `<|im_end|>`)."""
    thinking, content = self._thinking_and_content(m)
    out = Markup()
    if show_thinking:
      out.template(THINK_OPEN + "\n").content((thinking or "").strip("\n"))
      out.template(f"\n{THINK_CLOSE}\n\n").content(content.lstrip("\n"))
    else:
      out.content(content)
    for k, call in enumerate(m.tool_calls):
      if k > 0 or content:
        out.template("\n")
      args = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments,
                                                                                 ensure_ascii=False)
      out.template(CALL_OPEN + '\n{"name": "').content(call.name).template('", "arguments": ').content(args)
      out.template("}\n" + CALL_CLOSE)
    return out

  def render_markup(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
                    add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> Markup:
    """The prompt; `enable_thinking` None means the family's default."""
    out = Markup()
    for b in self.blocks(messages, tools):
      out.extend(self.block_markup(b))
    if add_generation_prompt:
      out.template(self.generation_prompt(enable_thinking))
    return out

  def render_text(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
                  add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> str:
    """The prompt as text."""
    return str(self.render_markup(messages, tools, add_generation_prompt=add_generation_prompt,
                                  enable_thinking=enable_thinking))

  def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *,
             add_generation_prompt: bool = True, enable_thinking: bool | None = None) -> list[int]:
    """Prompt ids of a conversation, tokenised in one piece (no caching, no splicing)."""
    return self.tokenizer.encode_markup(self.render_markup(
        messages, tools, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking))

  def echo_key(self, m: Message) -> tuple:
    """`turn_match_key` of an assistant message as a harness sent it (thinking written inline in the
    content, as some clients do, is left out like separate thinking)."""
    return turn_match_key(self._thinking_and_content(m)[1], m.tool_calls)

  def _thinking_and_content(self, m: Message) -> tuple[str | None, str]:
    if m.thinking is not None or not self.format.thinking:
      return m.thinking, m.content
    return split_thinking(m.content)

  @staticmethod
  def _last_query_index(messages: Sequence[Message]) -> int:
    """Index of the last real user query (a user message that is not just wrapped tool output)."""
    for i in range(len(messages) - 1, -1, -1):
      c = messages[i].content
      if messages[i].role == "user" and not (c.startswith(RESPONSE_OPEN) and c.endswith(RESPONSE_CLOSE)):
        return i
    return len(messages) - 1

  # ---- parsing ----------------------------------------------------------------------------------

  def parse(self, output_ids: Sequence[int], *, id_prefix: str = "call_") -> ParsedTurn:
    """Splits one sampled assistant turn into thinking, visible text and tool calls (the grammar in
    `clawjax.text.turn_stream`; the same parser streams a turn while it is generated)."""
    stream = self.turn_stream(id_prefix)
    stream.feed(output_ids)
    return stream.finish()[1]

  def turn_stream(self, id_prefix: str = "call_") -> TurnStream:
    """A parser fed one turn's ids as they are sampled."""
    return TurnStream(self.tokenizer.decode, self.stop_token_ids, id_prefix)


def family_of(name_or_path: str) -> str:
  """The chat family of a tokenizer name or HF model dir: Qwen models ("qwen3", config.json
  `model_type` qwen3, qwen3_moe, ...) use "qwen3", others (SmolLM2's llama) "chatml"."""
  path = pathlib.Path(name_or_path)
  name = model_type(path) if path.is_dir() else path.name
  return "qwen3" if name.lower().startswith("qwen") else "chatml"


def load_template(name_or_path: str, family: str | None = None) -> ChatTemplate:
  """The chat template for a tokenizer name ("qwen3", "smollm2") or HF model dir, with its tokenizer.

  `family` overrides the guess from the name / config.json `model_type`. A model preset resolves
  through `clawjax.models.vocab.text_source` first.
  """
  return ChatTemplate(family or family_of(name_or_path), load_tokenizer(name_or_path))
