"""The mini harness's tools: read, write, edit, bash, ls, with their OpenAI function-calling schemas.

Paths are relative to the workspace (absolute paths are taken as they are: the sandbox, not the tool,
is the isolation). A tool never raises on the agent's mistakes: it returns an error text for the model.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess
from collections.abc import Callable
from typing import Any


class ToolCallError(ValueError):
  """A tool call that cannot be run as given (unknown tool, missing or mistyped argument)."""


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  description: str
  params: dict[str, tuple[str, str]]  # name -> (JSON type, description)
  required: tuple[str, ...]
  fn: Callable[..., str]

  def schema(self) -> dict[str, Any]:
    props = {k: {"type": t, "description": d} for k, (t, d) in self.params.items()}
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object", "properties": props, "required": list(self.required)}}}


_JSON_TYPES = {"string": str, "integer": int}


class Toolbox:
  def __init__(self, workspace: pathlib.Path, bash_timeout_s: float, max_output_chars: int):
    self.workspace = workspace
    self.bash_timeout_s = bash_timeout_s
    self.max_output_chars = max_output_chars
    self.tools = {t.name: t for t in (
        Tool("read", "Read a text file.", {"path": ("string", "file path")}, ("path",), self._read),
        Tool("write", "Create or overwrite a file with the given content.",
             {"path": ("string", "file path"), "content": ("string", "the full new content")},
             ("path", "content"), self._write),
        Tool("edit", "Replace one exact, unique occurrence of old_text in a file with new_text.",
             {"path": ("string", "file path"), "old_text": ("string", "text to find"),
              "new_text": ("string", "replacement")}, ("path", "old_text", "new_text"), self._edit),
        Tool("bash", "Run a shell command in the workspace; returns exit code and output.",
             {"command": ("string", "the command")}, ("command",), self._bash),
        Tool("ls", "List a directory.", {"path": ("string", "directory (default: workspace)")}, (),
             self._ls),
    )}

  def schemas(self) -> list[dict[str, Any]]:
    return [t.schema() for t in self.tools.values()]

  def check(self, name: str, args: Any) -> None:
    """Raises ToolCallError when a call is malformed: the harness then re-asks the model."""
    tool = self.tools.get(name)
    if tool is None:
      raise ToolCallError(f"unknown tool {name!r}")
    if not isinstance(args, dict):
      raise ToolCallError(f"{name}: arguments must be a JSON object")
    for key in tool.required:
      if key not in args:
        raise ToolCallError(f"{name}: missing argument {key!r}")
    for key, value in args.items():
      if key not in tool.params:
        raise ToolCallError(f"{name}: unknown argument {key!r}")
      if not isinstance(value, _JSON_TYPES[tool.params[key][0]]):
        raise ToolCallError(f"{name}: argument {key!r} must be a {tool.params[key][0]}")

  def run(self, name: str, args: dict[str, Any]) -> str:
    try:
      out = self.tools[name].fn(**args)
    except OSError as e:
      out = f"error: {e}"
    if len(out) > self.max_output_chars:
      out = out[:self.max_output_chars] + f"\n[truncated {len(out) - self.max_output_chars} chars]"
    return out

  def _path(self, path: str) -> pathlib.Path:
    return self.workspace / path  # an absolute `path` replaces the workspace part

  def _read(self, path: str) -> str:
    return self._path(path).read_text(errors="replace")

  def _write(self, path: str, content: str) -> str:
    p = self._path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(content)
    return f"wrote {len(content)} chars to {path}"

  def _edit(self, path: str, old_text: str, new_text: str) -> str:
    p = self._path(path)
    text = p.read_text()
    n = text.count(old_text)
    if n != 1:
      return f"error: old_text occurs {n} times in {path}; it must occur exactly once"
    p.write_text(text.replace(old_text, new_text))
    return f"edited {path}"

  def _bash(self, command: str) -> str:
    try:
      proc = subprocess.run(["bash", "-c", command], cwd=self.workspace, capture_output=True,
                            text=True, errors="replace", timeout=self.bash_timeout_s,
                            start_new_session=True)
    except subprocess.TimeoutExpired:
      return f"error: command timed out after {self.bash_timeout_s:.0f} s"
    return f"exit code {proc.returncode}\n{proc.stdout}{proc.stderr}"

  def _ls(self, path: str = ".") -> str:
    p = self._path(path)
    return "\n".join(n + ("/" if (p / n).is_dir() else "") for n in sorted(os.listdir(p)))
