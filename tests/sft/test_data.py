"""Bad input: a malformed line names its file and line and either stops the run or is skipped and
counted (`bad_lines`); a role, tool or block type the format does not know always stops it, naming the
field; a conversation over the length limit is cut at a turn's end or dropped, counted either way."""
from __future__ import annotations

import collections
import json
import subprocess
import sys
import pathlib

import pytest

from clawjax.config import ConfigError
from clawjax.sft.config import sft_config
from clawjax.sft.data import DataError, FormatError, read_conversations
from clawjax.sft.dataset import load_trees
from clawjax.text.templates import load_template

from tests.sft.helpers import ANTHROPIC_CONVERSATION, OPENAI_CONVERSATION, write_jsonl

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOOD = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _read(path, fmt="openai", bad_lines="stop"):
  counts = collections.Counter()
  return list(read_conversations(str(path), fmt, bad_lines=bad_lines, counts=counts)), counts


def _config(tmp_path, **fields):
  return sft_config({"data": {"openai": [str(write_jsonl(tmp_path / "ok.jsonl", [GOOD]))]},
                     "model": {"init": "test-tiny"}, "tensorboard": False, **fields})


@pytest.mark.parametrize("line, where", [
    ("{not json", "not a JSON object"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({"messages": "hi"}), "messages: expected an array"),
    (json.dumps({"messages": [{"role": "user", "content": 5}]}), "messages.0.content"),
    (json.dumps({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "c", "type": "function"}]}]}),
     "messages.0.tool_calls.0.function: field required"),
])
def test_a_malformed_line_names_file_and_line_and_stops_or_is_skipped(tmp_path, line, where):
  path = write_jsonl(tmp_path / "data.jsonl", [GOOD, line, GOOD])
  with pytest.raises(DataError, match=f"data.jsonl:2: .*{where}") as e:
    _read(path)
  assert not isinstance(e.value, FormatError)
  convs, counts = _read(path, bad_lines="skip")
  assert [c.where for c in convs] == [f"{path}:1", f"{path}:3"]
  assert counts["bad_lines"] == 1


def test_a_line_that_is_not_utf8_is_a_malformed_line(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe{\n")
  with pytest.raises(DataError, match="data.jsonl:2: not a JSON object"):
    _read(path)
  assert _read(path, bad_lines="skip")[1]["bad_lines"] == 1


@pytest.mark.parametrize("fmt, conversation, match", [
    ("openai", {"messages": [{"role": "human", "content": "hi"}]}, r"messages.0.role: unknown role 'human'"),
    ("openai", {"messages": [{"role": "function", "name": "f", "content": "1"}]}, r"messages.0.role: unknown role"),
    ("openai", {"messages": [{"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]},
     r"messages.0.function_call: the legacy function_call format"),
    ("openai", {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "custom", "custom": {"name": "f", "input": "x"}}]}]},
     r"messages.0.tool_calls.0.type: unknown tool-call format 'custom'"),
    ("openai", dict(GOOD, tools=[{"type": "code_interpreter"}]), r"tools.0: unknown tool format"),
    ("openai", dict(GOOD, tools=[{"name": "f", "parameters": {}}]), r"tools.0: unknown tool format"),
    ("anthropic", {"messages": [{"role": "tool", "content": "x"}]}, r"messages.0.role: unknown role 'tool'"),
    ("anthropic", dict(ANTHROPIC_CONVERSATION, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
     r"tools.0: unknown tool format"),
    ("anthropic", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]},
     r"messages.1.content.0.type: unknown block type 'server_tool_use'"),
])
def test_an_unknown_role_or_tool_format_stops_even_when_skipping(tmp_path, fmt, conversation, match):
  path = write_jsonl(tmp_path / "data.jsonl", [GOOD if fmt == "openai" else ANTHROPIC_CONVERSATION, conversation])
  for policy in ("stop", "skip"):
    with pytest.raises(FormatError, match=f"data.jsonl:2: {match}"):
      _read(path, fmt, policy)


def test_tools_file_fills_in_tools_and_is_checked(tmp_path):
  template = load_template("qwen3")
  no_tools = dict(OPENAI_CONVERSATION)
  del no_tools["tools"]
  data = write_jsonl(tmp_path / "data.jsonl", [no_tools, OPENAI_CONVERSATION])
  tools = tmp_path / "tools.json"
  tools.write_text(json.dumps(OPENAI_CONVERSATION["tools"]))
  cfg = _config(tmp_path, data={"openai": [str(data)]}, tools_file=str(tools))
  first, second = load_trees(cfg.data, template, cfg, collections.Counter())
  assert first.tokens_T.tolist() == second.tokens_T.tolist()  # same tools, from the file or the line
  tools.write_text(json.dumps([{"type": "retrieval"}]))
  with pytest.raises(FormatError, match="tools.json: tools.0: unknown tool format"):
    load_trees(cfg.data, template, cfg, collections.Counter())


def test_arguments_that_are_not_an_object_do_not_read_back(tmp_path):
  bad = {"messages": [{"role": "user", "content": "go"},
                      {"role": "assistant", "content": "", "tool_calls": [
                          {"id": "c", "type": "function", "function": {"name": "write", "arguments": "[1, 2]"}}]},
                      {"role": "tool", "tool_call_id": "c", "content": "ok"},
                      {"role": "assistant", "content": "Done."}]}
  data = write_jsonl(tmp_path / "data.jsonl", [GOOD, bad])
  cfg = _config(tmp_path, data={"openai": [str(data)]})
  with pytest.raises(DataError, match=r"data.jsonl:2: an assistant turn before turn 1 does not read back"):
    load_trees(cfg.data, load_template("qwen3"), cfg, collections.Counter())
  counts = collections.Counter()
  trees = load_trees(cfg.data, load_template("qwen3"), _config(tmp_path, data={"openai": [str(data)]},
                                                               bad_lines="skip"), counts)
  assert len(trees) == 1 and counts["bad_lines"] == 1 and counts["conversations"] == 2


def test_overlong_conversations_are_cut_or_dropped_and_counted(tmp_path):
  template = load_template("qwen3")
  data = write_jsonl(tmp_path / "data.jsonl", [GOOD, OPENAI_CONVERSATION])
  for overlong, expected in (("cut", {"whole": 1, "cut": 1}), ("drop", {"whole": 1, "dropped": 1})):
    counts = collections.Counter()
    cfg = _config(tmp_path, data={"openai": [str(data)]}, max_len=320, overlong=overlong)
    trees = load_trees(cfg.data, template, cfg, counts)
    assert {k: counts[k] for k in ("whole", "cut", "dropped") if counts[k]} == expected
    assert all(t.size <= 320 for t in trees) and len(trees) == (2 if overlong == "cut" else 1)


def test_config_errors_name_the_field(tmp_path):
  with pytest.raises(ConfigError, match="config.data: no source"):
    sft_config({"model": {"init": "test-tiny"}, "tensorboard": False})
  with pytest.raises(ConfigError, match="config.data.openai: '/nope.jsonl' does not exist"):
    _config(tmp_path, data={"openai": ["/nope.jsonl"]})
  with pytest.raises(ConfigError, match="config.bad_lines: 'ignore' is not one of"):
    _config(tmp_path, bad_lines="ignore")
  with pytest.raises(ConfigError, match="config.learner.loss: 'grpo'"):
    _config(tmp_path, learner={"loss": "grpo"})
  with pytest.raises(ConfigError, match="config.data.parquet: unknown field"):
    sft_config({"data": {"parquet": ["x"]}}, [])


def test_the_command_line_reports_a_bad_line_and_exits(tmp_path):
  data = write_jsonl(tmp_path / "data.jsonl", [GOOD, "{oops"])
  proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "sft.py"),
                         f"--config={ROOT / 'configs' / 'sft' / 'cpu_small.py'}", f"--config.data.openai={data}",
                         "--config.tensorboard=False", f"--workdir={tmp_path / 'run'}"],
                        capture_output=True, text=True, timeout=300, cwd=ROOT,
                        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"})
  assert proc.returncode != 0
  assert f"error: {data}:2: not a JSON object" in proc.stderr
  assert not (tmp_path / "run" / "checkpoints" / "1").exists()
