"""`scripted`: a test policy that plays a script of assistant turns. It stands for the model only.

Each `generate` call plays the next turn of the script: the turn (text, thinking, tool calls) is written
the way the model family writes it (`ChatTemplate.assistant_body`), tokenised with the real tokenizer,
ended with the end-of-turn token, and given deterministic log-probs (a fixed function of position and
token id, all in [-2, -0.01]), so the whole shim path (template, splicing, parsing, call log) runs
for real on CPU. `max_new_tokens` truncates a turn (finish_reason "length"). Timing: `latency_s` before
the first token, then `token_latency_s` per token, which `generate_streaming` hands on one by one.
Failures can be injected: `failures={k: status}` raises BackendError(status) on the k-th generate call
(0-based, counting failures), after `failure_after_tokens` of its tokens were streamed; a harness then
retries. After the last turn, the last turn repeats.

Script file (JSON, for `--backend scripted --backend-arg script=FILE`): a list of turns, each
{"text": str, "thinking": str?, "tool_calls": [{"name": str, "arguments": {...}}]}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from clawjax.generation import Generation, SamplingParams, TokenSink
from clawjax.models.vocab import text_source
from clawjax.serving.backends.base import BackendError, PromptIds, SamplingBackend, register_backend
from clawjax.text.messages import Message, ToolCall
from clawjax.text.templates import ChatTemplate, load_template


@dataclasses.dataclass(frozen=True)
class ScriptTurn:
  text: str = ""
  thinking: str | None = None
  tool_calls: tuple[tuple[str, dict[str, Any]], ...] = ()  # (name, arguments)

  @classmethod
  def from_json(cls, obj: Any, where: str) -> "ScriptTurn":
    if not isinstance(obj, dict):
      raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
    unknown = set(obj) - {"text", "thinking", "tool_calls"}
    if unknown:
      raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    calls = []
    for i, c in enumerate(obj.get("tool_calls", [])):
      if not (isinstance(c, dict) and isinstance(c.get("name"), str)
              and isinstance(c.get("arguments", {}), dict)):
        raise ValueError(f"{where}.tool_calls.{i}: expected {{name: str, arguments: object}}")
      calls.append((c["name"], c.get("arguments", {})))
    text, thinking = obj.get("text", ""), obj.get("thinking")
    if not isinstance(text, str) or not (thinking is None or isinstance(thinking, str)):
      raise ValueError(f"{where}: text and thinking must be strings")
    return cls(text, thinking, tuple(calls))


def load_script(path: str) -> list[ScriptTurn]:
  with open(path, encoding="utf-8") as fh:
    try:
      data = json.load(fh)
    except ValueError as e:
      raise ValueError(f"{path}: not valid JSON: {e}") from None
  if not isinstance(data, list) or not data:
    raise ValueError(f"{path}: expected a non-empty JSON list of turns")
  return [ScriptTurn.from_json(t, f"{path}: turn {i}") for i, t in enumerate(data)]


def turn_ids(template: ChatTemplate, turn: ScriptTurn) -> list[int]:
  """The ids a model of this family samples for `turn`, end-of-turn token included."""
  message = Message("assistant", turn.text, thinking=turn.thinking,
                    tool_calls=[ToolCall("", name, args) for name, args in turn.tool_calls])
  body = template.assistant_body(message, show_thinking=turn.thinking is not None)
  # The script is what the model writes: an added token it spells (a `<tool_call>`) is one it sampled.
  return template.tokenizer.encode(str(body)) + [template.stop_token_ids[0]]


def scripted_logprob(position: int, token_id: int) -> float:
  """A deterministic stand-in log-prob in [-2, -0.01]."""
  return -0.01 - 1.99 * ((position * 7919 + token_id * 104729) % 1000) / 1000.0


class ScriptedBackend(SamplingBackend):
  """Plays `script` (a list of turns, or a function of the prompt ids returning a turn)."""

  def __init__(self, template: ChatTemplate,
               script: Sequence[ScriptTurn] | Callable[[Sequence[int]], ScriptTurn],
               failures: dict[int, int] | None = None, latency_s: float = 0.0,
               policy_version: int = 0, token_latency_s: float = 0.0, failure_after_tokens: int = 0):
    if not callable(script) and not script:
      raise ValueError("ScriptedBackend: empty script")
    self.template, self.script = template, script
    self.failures = dict(failures or {})
    self.latency_s, self.policy_version = latency_s, policy_version
    self.token_latency_s, self.failure_after_tokens = token_latency_s, failure_after_tokens
    self.calls = 0  # generate calls so far, failures included
    self.turns_played = 0

  def _next_turn(self, input_ids: Sequence[int]) -> ScriptTurn:
    """The turn to play; a failed call does not use it up (the retry plays it)."""
    if callable(self.script):
      return self.script(input_ids)
    return self.script[min(self.turns_played, len(self.script) - 1)]

  async def sample(self, prompt: PromptIds, params: SamplingParams,
                   on_tokens: TokenSink | None) -> Generation:
    call, self.calls = self.calls, self.calls + 1
    if self.latency_s:
      await asyncio.sleep(self.latency_s)
    failure = None
    if call in self.failures:
      failure = BackendError(f"scripted failure injected on call {call}", status=self.failures[call])
      if not self.failure_after_tokens:
        raise failure  # Before asking the script: a stateful script function sees only played calls.
    ids = turn_ids(self.template, self._next_turn(prompt.ids))
    finish = "stop"
    if len(ids) > params.max_new_tokens:
      ids, finish = ids[:params.max_new_tokens], "length"
    for token in ids[:self.failure_after_tokens] if failure else ids:
      if self.token_latency_s:
        await asyncio.sleep(self.token_latency_s)
      if on_tokens is not None:
        on_tokens([token])
    if failure:
      raise failure
    self.turns_played += 1
    logprobs = [scripted_logprob(len(prompt.ids) + i, t) for i, t in enumerate(ids)]
    return Generation(tuple(ids), tuple(logprobs), finish, self.policy_version)


def _parse_failures(spec: str | dict[int, int] | None) -> dict[int, int]:
  """"3:500,5:529" -> {3: 500, 5: 529}."""
  if spec is None or isinstance(spec, dict):
    return dict(spec or {})
  out = {}
  for item in filter(None, spec.split(",")):
    try:
      k, status = item.split(":")
      out[int(k)] = int(status)
    except ValueError:
      raise ValueError(f"scripted failures: {item!r} is not CALL:STATUS") from None
  return out


@register_backend("scripted")
def make_scripted(model: str, script: str | Sequence[ScriptTurn], url: str | None = None,
                  failures: str | dict[int, int] | None = None, latency_s: float | str = 0.0,
                  template: ChatTemplate | None = None, token_latency_s: float | str = 0.0,
                  failure_after_tokens: int | str = 0) -> ScriptedBackend:
  del url  # The script is the model: nothing to connect to.
  turns = load_script(script) if isinstance(script, str) else list(script)
  return ScriptedBackend(template or load_template(text_source(model)), turns, _parse_failures(failures),
                         float(latency_s), token_latency_s=float(token_latency_s),
                         failure_after_tokens=int(failure_after_tokens))
