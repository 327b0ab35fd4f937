"""The mini harness's agent loop over the OpenAI Chat Completions API (plain HTTP, no SDK).

It behaves like the real harnesses in the ways the tree stage must handle:
- a malformed tool call (unparsable arguments, unknown tool, a `<tool_call>` left as text) is not
  answered: the same request is sent again, so the bad attempt becomes a retry dead leaf;
- an HTTP 5xx/429 is retried with the byte-identical body after a backoff;
- when the conversation exceeds a token budget (or the server says the context is too long), a
  separate summarising request (its own system prompt, no tools) condenses it, and the loop continues
  from [system, task + summary]: a compaction branch.
Every request, response, retry and tool result goes to a transcript JSONL.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
import urllib.error
import urllib.request
from typing import Any, TextIO

from clawjax.harness.mini.tools import ToolCallError, Toolbox

SYSTEM_PROMPT = (
    "You are mini, a coding agent working in a workspace directory. Use the tools to inspect and "
    "change files and run commands. When the task is done, answer with a short final message and no "
    "tool call.")
# The shim's mini profile recognises compaction calls by this opening (role "compaction").
COMPACTION_PROMPT = (
    "You are mini's context summariser. Summarise the conversation below for the agent that will "
    "continue it: the task, what has been done (files changed, commands run, results), and what "
    "remains. Be concise and keep exact file names.")


@dataclasses.dataclass(frozen=True)
class MiniConfig:
  model: str = "policy"
  max_turns: int = 30              # model calls of the main loop (retries excluded)
  max_tokens: int = 2048           # per call, sent as max_tokens
  temperature: float = 0.7
  context_budget_tokens: int = 24000  # compact when the last call's prompt + output exceed this
  compaction_input_chars: int = 32000  # the summariser sees at most the last this many history chars
  malformed_retries: int = 2       # re-asks of a request whose answer has a malformed tool call
  http_retries: int = 3            # re-sends of a request that got 5xx/429 or a dropped connection
  http_backoff_s: float = 0.5      # first backoff; doubles per retry
  http_timeout_s: float = 600.0
  bash_timeout_s: float = 60.0
  max_tool_output_chars: int = 16000


class HarnessError(RuntimeError):
  pass


class ContextTooLong(HarnessError):
  pass


class MiniAgent:
  def __init__(self, base_url: str, api_key: str, workspace: pathlib.Path, config: MiniConfig,
               transcript: TextIO):
    self.url = base_url.rstrip("/") + "/v1/chat/completions"
    self.api_key = api_key
    self.config = config
    self.tools = Toolbox(workspace, config.bash_timeout_s, config.max_tool_output_chars)
    self.transcript = transcript
    self.calls = 0

  def _log(self, event: str, **fields: Any) -> None:
    self.transcript.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
    self.transcript.flush()

  def _post(self, body: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(body).encode()
    backoff = self.config.http_backoff_s
    for attempt in range(self.config.http_retries + 1):
      req = urllib.request.Request(self.url, data=data, method="POST", headers={
          "content-type": "application/json", "authorization": f"Bearer {self.api_key}"})
      self.calls += 1
      try:
        with urllib.request.urlopen(req, timeout=self.config.http_timeout_s) as resp:
          return json.loads(resp.read())
      except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")
        if e.code == 400 and "context_length_exceeded" in text:
          raise ContextTooLong(text) from None
        if e.code < 500 and e.code != 429:
          raise HarnessError(f"HTTP {e.code}: {text[:2000]}") from None
        self._log("http_retry", attempt=attempt, status=e.code, body=text[:2000])
      except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        self._log("http_retry", attempt=attempt, error=str(e))
      if attempt < self.config.http_retries:
        time.sleep(backoff)
        backoff *= 2
    raise HarnessError(f"gave up after {self.config.http_retries + 1} attempts at {self.url}")

  def _complete(self, messages: list[dict], tools: bool) -> dict[str, Any]:
    body = {"model": self.config.model, "messages": messages, "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature, "stream": False}
    if tools:
      body["tools"] = self.tools.schemas()
    self._log("request", n_messages=len(messages), tools=tools)
    resp = self._post(body)
    self._log("response", body=resp)
    choices = resp.get("choices") if isinstance(resp, dict) else None
    if not choices or not isinstance(choices[0], dict) or "message" not in choices[0]:
      raise HarnessError(f"response without choices[0].message: {str(resp)[:2000]}")
    return resp

  def _parse_tool_calls(self, message: dict[str, Any]) -> list[tuple[str, str, dict]]:
    """(id, name, args) per tool call; raises ToolCallError when any is malformed."""
    if "<tool_call>" in (message.get("content") or ""):
      raise ToolCallError("a <tool_call> came back as text: the server could not parse it")
    calls = []
    for tc in message.get("tool_calls") or []:
      fn = tc.get("function") or {}
      try:
        args = json.loads(fn.get("arguments") or "{}")
      except json.JSONDecodeError as e:
        raise ToolCallError(f"arguments of {fn.get('name')!r} are not JSON: {e}") from None
      self.tools.check(fn.get("name"), args)
      calls.append((tc.get("id"), fn["name"], args))
    return calls

  def _usage_tokens(self, resp: dict[str, Any], messages: list[dict]) -> int:
    usage = resp.get("usage") or {}
    if "prompt_tokens" in usage:
      return usage["prompt_tokens"] + usage.get("completion_tokens", 0)
    return len(json.dumps(messages)) // 4  # a server without usage: ~4 chars per token

  def _compact(self, task: str, messages: list[dict]) -> list[dict]:
    history = "\n\n".join(
        f"[{m['role']}] {m.get('content') or ''}"
        + "".join(f"\n<call {tc['function']['name']}> {tc['function']['arguments']}"
                  for tc in m.get("tool_calls") or [])
        for m in messages[1:])[-self.config.compaction_input_chars:]
    resp = self._complete([{"role": "system", "content": COMPACTION_PROMPT},
                           {"role": "user", "content": history}], tools=False)
    summary = resp["choices"][0]["message"].get("content") or ""
    self._log("compaction", summary=summary)
    return [messages[0], {"role": "user", "content": f"{task}\n\nProgress so far (summary):\n{summary}"}]

  def run(self, task: str) -> dict[str, Any]:
    """Runs until a final answer or max_turns; returns a result summary."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]
    used_tokens = 0
    for turn in range(self.config.max_turns):
      if used_tokens > self.config.context_budget_tokens:
        messages, used_tokens = self._compact(task, messages), 0
      for attempt in range(self.config.malformed_retries + 1):
        try:
          resp = self._complete(messages, tools=True)
        except ContextTooLong:
          messages = self._compact(task, messages)
          resp = self._complete(messages, tools=True)
        message = resp["choices"][0]["message"]
        try:
          calls = self._parse_tool_calls(message)
          break
        except ToolCallError as e:
          error = str(e)
          self._log("malformed_tool_call", attempt=attempt, error=error)
      else:
        # Out of re-asks: show the model its mistake instead of looping forever.
        messages += [{"role": "assistant", "content": message.get("content") or ""},
                     {"role": "user", "content": f"Your tool call was malformed ({error}). Try again."}]
        continue
      used_tokens = self._usage_tokens(resp, messages)
      assistant = {"role": "assistant", "content": message.get("content") or ""}
      if not calls:
        messages.append(assistant)
        self._log("final", content=assistant["content"])
        return {"status": "done", "result": assistant["content"], "turns": turn + 1,
                "calls": self.calls}
      assistant["tool_calls"] = [
          {"id": cid, "type": "function",
           "function": {"name": name, "arguments": json.dumps(args)}} for cid, name, args in calls]
      messages.append(assistant)
      for cid, name, args in calls:
        out = self.tools.run(name, args)
        self._log("tool", name=name, args=args, output=out[:2000])
        messages.append({"role": "tool", "tool_call_id": cid, "content": out})
    self._log("max_turns")
    return {"status": "max_turns", "result": None, "turns": self.config.max_turns,
            "calls": self.calls}
