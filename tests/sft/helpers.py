"""Shared by the SFT tests: trajectories in both formats, and a shim that replays them."""
from __future__ import annotations

import contextlib
import json
import pathlib

from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.text.messages import Message

OPENAI_TOOLS = [
    {"type": "function", "function": {
        "name": "write", "description": "Create or overwrite a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
]
# An OpenClaw-shaped conversation: a system prompt, reasoning on the first turn, two tool calls in one
# turn, tool results, an internal-context user message, and a final answer.
OPENAI_CONVERSATION = {"messages": [
    {"role": "system", "content": "You are a personal agent. Work in the workspace."},
    {"role": "user", "content": [{"type": "text", "text": "Count the ERROR lines of app.log into errors.txt."}]},
    {"role": "assistant", "content": "I will count them.", "reasoning_content": "grep -c does it.",
     "tool_calls": [{"id": "call_a1", "type": "function",
                     "function": {"name": "bash", "arguments": "{\"command\":\"grep -c ERROR app.log\"}"}}]},
    {"role": "tool", "tool_call_id": "call_a1", "content": "exit code 0\n3\n"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_b2", "type": "function",
         "function": {"name": "write", "arguments": "{\"path\": \"errors.txt\", \"content\": \"3\"}"}},
        {"id": "call_c3", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"cat errors.txt\"}"}}]},
    {"role": "tool", "tool_call_id": "call_b2", "content": "wrote 1 chars to errors.txt"},
    {"role": "tool", "tool_call_id": "call_c3", "content": "exit code 0\n3"},
    {"role": "user", "content": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> note"},
    {"role": "assistant", "content": "errors.txt holds 3."}],
    "tools": OPENAI_TOOLS}

ANTHROPIC_TOOLS = [
    {"name": "Write", "description": "Write a file.", "cache_control": {"type": "ephemeral"},
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}}}},
    {"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object",
                                                                       "properties": {"command": {"type": "string"}}}},
]
# A Claude Code-shaped conversation: system blocks, thinking and text before a tool_use, tool_result
# blocks (one flagged is_error), a system reminder in the user turn, and a final answer.
ANTHROPIC_CONVERSATION = {
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Write hello.py printing hi, then run it."}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "A one-line script.", "signature": "sig"},
            {"type": "text", "text": "Writing it."},
            {"type": "tool_use", "id": "toolu_1", "name": "Write",
             "input": {"file_path": "hello.py", "content": "print('hi')\n"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "File created."}]}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "python hello.py"}},
            {"type": "tool_use", "id": "toolu_3", "name": "Bash", "input": {"command": "python3 hello.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "python: not found", "is_error": True},
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": "hi"},
            {"type": "text", "text": "<system-reminder>Keep going.</system-reminder>"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Done: it prints hi."}]}],
    "tools": ANTHROPIC_TOOLS}


def write_jsonl(path: pathlib.Path, rows: list) -> pathlib.Path:
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


def script_turn(m: Message) -> ScriptTurn:
  """What the scripted policy plays for an assistant message: the model writing that turn."""
  return ScriptTurn(m.content, m.thinking, tuple((c.name, c.arguments) for c in m.tool_calls))


@contextlib.contextmanager
def replay_shim(template, turns: list[ScriptTurn], log_dir: pathlib.Path):
  """A shim whose scripted backend plays `turns` in order, with the real template."""
  with ShimThread(ShimConfig(log_dir=str(log_dir)), ScriptedBackend(template, turns), template) as shim:
    yield shim
