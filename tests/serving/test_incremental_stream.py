"""--incremental-stream: text and thinking reach the official SDKs while the backend is still sampling,
and add up to exactly the turn the non-incremental path sends and the call log records."""
import time

import anthropic
import openai
import pytest

from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn

from tests.serving.helpers import FINAL_TURN, READ_TURN, WRITE_TURN, assert_linear_zero_drift, log_calls
from tests.serving.test_anthropic import TOOLS, tool_loop

LONG_TURN = ScriptTurn(
    text="First I will look at the layout of the project, then write the file you asked for, and "
         "finally check that it holds what it should. Ünïcødé 数字 😀 included.",
    thinking="The user wants a file.\nI should write it, then read it back.",
    tool_calls=(("write_file", {"path": "a.txt", "content": "hello"}),))
TOKEN_S = 0.02  # Scripted sampling time per token.


def _timed(events):
  start = time.monotonic()
  return [(time.monotonic() - start, e) for e in events]


def test_anthropic_text_arrives_while_sampling_and_equals_the_whole_turn(make_shim, template):
  backend = ScriptedBackend(template, [LONG_TURN], token_latency_s=TOKEN_S)
  shim = make_shim(None, backend=backend, incremental_stream=True)
  rollout = shim.create_rollout("t", "claude_code")
  c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
  with c.messages.stream(model="m", max_tokens=1000, tools=TOOLS[:1],
                         messages=[{"role": "user", "content": "go"}]) as s:
    timed = _timed(s)
    streamed = s.get_final_message()
  deltas = [(t, e.delta) for t, e in timed if e.type == "content_block_delta"]
  text_deltas = [(t, d.text) for t, d in deltas if d.type == "text_delta"]
  thinking_deltas = [(t, d.thinking) for t, d in deltas if d.type == "thinking_delta"]
  assert len(text_deltas) > 10 and len(thinking_deltas) > 5
  assert "".join(d for _, d in thinking_deltas) == LONG_TURN.thinking
  assert "".join(d for _, d in text_deltas) == LONG_TURN.text
  stop_t = next(t for t, e in timed if e.type == "message_stop")
  # At least the tool call's tokens (~20) were still being sampled after the last text delta.
  assert stop_t - text_deltas[-1][0] > 10 * TOKEN_S
  assert text_deltas[0][0] < text_deltas[-1][0] - 20 * TOKEN_S

  # The same turn through the non-incremental path: the same message, tool ids aside.
  plain = make_shim([LONG_TURN]).create_rollout("t", "claude_code")
  c2 = anthropic.Anthropic(base_url=plain["base_url"], api_key=plain["api_key"], max_retries=0)
  with c2.messages.stream(model="m", max_tokens=1000, tools=TOOLS[:1],
                          messages=[{"role": "user", "content": "go"}]) as s:
    whole = s.get_final_message()
  strip_ids = lambda m: [b.model_dump(exclude={"id"}) for b in m.content]
  assert strip_ids(streamed) == strip_ids(whole)
  assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use"]
  assert streamed.stop_reason == whole.stop_reason == "tool_use"
  (call,) = log_calls(rollout["log_path"])
  assert template.parse(call.output_ids).text == LONG_TURN.text


def test_openai_content_arrives_while_sampling(make_shim, template):
  backend = ScriptedBackend(template, [LONG_TURN], token_latency_s=TOKEN_S)
  shim = make_shim(None, backend=backend, incremental_stream=True)
  rollout = shim.create_rollout("t", "openclaw")
  c = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
  chunks = _timed(c.chat.completions.create(
      model="m", messages=[{"role": "user", "content": "go"}], stream=True,
      stream_options={"include_usage": True},
      tools=[{"type": "function", "function": {"name": "write_file", "parameters": {}}}]))
  content = [(t, ch.choices[0].delta.content) for t, ch in chunks
             if ch.choices and ch.choices[0].delta.content]
  reasoning = [getattr(ch.choices[0].delta, "reasoning_content", None) for _, ch in chunks
               if ch.choices]
  assert len(content) > 10
  assert "".join(d for _, d in content) == LONG_TURN.text
  assert "".join(r for r in reasoning if r) == LONG_TURN.thinking
  calls = [tc for _, ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
  assert [(tc.function.name, tc.function.arguments) for tc in calls] == [
      ("write_file", '{"path":"a.txt","content":"hello"}')]
  finish_t = next(t for t, ch in chunks if ch.choices and ch.choices[0].finish_reason)
  assert finish_t - content[-1][0] > 10 * TOKEN_S
  assert chunks[-1][1].usage.completion_tokens == len(log_calls(rollout["log_path"])[0].output_ids)


def test_tool_loop_streams_with_zero_drift(make_shim, template):
  backend = ScriptedBackend(template, [WRITE_TURN, READ_TURN, FINAL_TURN], token_latency_s=0.001)
  shim = make_shim(None, backend=backend, incremental_stream=True)
  rollout = shim.create_rollout("task-1", "claude_code")
  c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
  replies = tool_loop(c, stream=True)
  assert replies[0].content[1].text == WRITE_TURN.text
  assert replies[2].content[0].text == FINAL_TURN.text
  calls = assert_linear_zero_drift(rollout["log_path"], 3)
  assert [c.extra["spliced_turns"] for c in calls] == [0, 1, 2]


def test_backend_failure_mid_stream_is_an_error_event_and_an_error_record(make_shim, template):
  backend = ScriptedBackend(template, [LONG_TURN], failures={0: 529}, failure_after_tokens=25,
                            token_latency_s=0.005)
  shim = make_shim(None, backend=backend, incremental_stream=True)
  rollout = shim.create_rollout("t", "claude_code")
  c = anthropic.Anthropic(base_url=rollout["base_url"], api_key=rollout["api_key"], max_retries=0)
  kwargs = dict(model="m", max_tokens=1000, messages=[{"role": "user", "content": "go"}])
  seen = []
  with pytest.raises(anthropic.APIStatusError, match="overloaded|backend error"):
    with c.messages.stream(**kwargs) as s:
      for e in s:
        if e.type == "content_block_delta" and e.delta.type == "thinking_delta":
          seen.append(e.delta.thinking)
  assert seen and LONG_TURN.thinking.startswith("".join(seen))  # Some thinking got out first.
  with c.messages.stream(**kwargs) as s:  # The harness's retry.
    assert s.get_final_message().content[1].text == LONG_TURN.text
  first, second = log_calls(rollout["log_path"])
  assert first.status == "error" and first.output_ids == () and first.extra["backend_status"] == 529
  assert second.status == "ok" and second.input_ids == first.input_ids


def test_responses_items_stream_while_sampling_and_equal_the_whole_turn(make_shim, template):
  backend = ScriptedBackend(template, [LONG_TURN], token_latency_s=TOKEN_S)
  shim = make_shim(None, backend=backend, incremental_stream=True)
  rollout = shim.create_rollout("t", "codex")
  c = openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"], max_retries=0)
  kwargs = dict(model="m", input="go", include=["reasoning.encrypted_content"],
                tools=[{"type": "function", "name": "write_file", "parameters": {}}])
  with c.responses.stream(**kwargs) as s:
    timed = _timed(s)
    streamed = s.get_final_response()
  text = [(t, e.delta) for t, e in timed if e.type == "response.output_text.delta"]
  thinking = [e.delta for _, e in timed if e.type == "response.reasoning_text.delta"]
  assert len(text) > 10 and len(thinking) > 5
  assert "".join(d for _, d in text) == LONG_TURN.text and "".join(thinking) == LONG_TURN.thinking
  done_t = next(t for t, e in timed if e.type == "response.completed")
  assert done_t - text[-1][0] > 10 * TOKEN_S  # The tool call was still being sampled.
  # The same turn through the non-incremental path: the same items, ids aside.
  plain = make_shim([LONG_TURN]).create_rollout("t", "codex")
  c2 = openai.OpenAI(base_url=plain["openai_base_url"], api_key=plain["api_key"], max_retries=0)
  with c2.responses.stream(**kwargs) as s:
    whole = s.get_final_response()
  strip_ids = lambda r: [o.model_dump(exclude={"id", "call_id", "encrypted_content"}) for o in r.output]
  assert strip_ids(streamed) == strip_ids(whole)
  assert [o.type for o in streamed.output] == ["reasoning", "message", "function_call"]
  assert streamed.usage.output_tokens == len(log_calls(rollout["log_path"])[0].output_ids)
