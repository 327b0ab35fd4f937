"""Per-harness profiles: which `role` a call gets in the log (main, compaction, subagent, auxiliary).

The shim sees only the request, so a role is recognised from its shape: a rule matches a regular
expression against the system prompt, the last user message, or a key of the metadata the client sent
with the call (`meta:KEY`: Codex's turn metadata, see openai_responses.py), optionally only for calls
with (or without) tools. Rules are tried in order; no match -> the profile's default role. The patterns
below are the phrases the harnesses' own prompts use (observed on Claude Code 2.1 and OpenClaw 2026.9)
and the metadata Codex 0.169 sends; a new harness version that rewords them only needs a new rule, e.g.
from a JSON file given to the server.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from clawjax.calllog import ROLES
from clawjax.serving.chat import ChatRequest

_PLACES = ("system", "last_user")
_META = "meta:"


@dataclasses.dataclass(frozen=True)
class RoleRule:
  role: str
  # "system" (all system messages), "last_user" (the last user message) or "meta:KEY" (the request
  # metadata's KEY: a string as it is, another value as JSON; no match when the key is absent).
  place: str
  pattern: str  # A Python regular expression, searched (not anchored).
  has_tools: bool | None = None  # None: either.

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"RoleRule.role: {self.role!r} is not one of {ROLES}")
    if self.place not in _PLACES and not (self.place.startswith(_META) and len(self.place) > len(_META)):
      raise ValueError(f"RoleRule.place: {self.place!r} is not one of {_PLACES} or 'meta:KEY'")
    re.compile(self.pattern)


@dataclasses.dataclass(frozen=True)
class HarnessProfile:
  name: str
  rules: tuple[RoleRule, ...] = ()
  default_role: str | None = "main"

  def role(self, request: ChatRequest) -> str | None:
    system = "\n".join(m.content for m in request.messages if m.role == "system")
    last_user = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    for rule in self.rules:
      if rule.has_tools is not None and rule.has_tools != bool(request.tools):
        continue
      if rule.place == "system":
        text = system
      elif rule.place == "last_user":
        text = last_user
      else:
        value = request.metadata.get(rule.place[len(_META):])
        if value is None:
          continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
      if re.search(rule.pattern, text):
        return rule.role
    return self.default_role


_COMPACTION = r"(?i)(create a detailed summary of the conversation|summari[sz]e the conversation so far)"
PROFILES: dict[str, HarnessProfile] = {
    "claude_code": HarnessProfile("claude_code", rules=(
        RoleRule("compaction", "last_user", _COMPACTION),
        # Subagents (Task tool) get "You are an agent for Claude Code"; the main loop
        # "You are Claude Code".
        RoleRule("subagent", "system", r"You are an agent for Claude Code"),
        # Title / topic side calls carry no tools.
        RoleRule("auxiliary", "system", r".", has_tools=False),
    )),
    "openclaw": HarnessProfile("openclaw", rules=(
        RoleRule("compaction", "last_user", _COMPACTION),
        RoleRule("subagent", "system", r"(?i)you are a sub-?agent"),
        RoleRule("auxiliary", "system", r".", has_tools=False),
    )),
    # Codex says in its turn metadata what each call is (what 0.169 sent, docs/harnesses.md):
    # request_kind "compaction" for a compaction (local, or the remote compaction_trigger kind), "turn"
    # for an agent's step; thread_source "subagent" for a thread spawned by multi_agent_v1.spawn_agent.
    "codex": HarnessProfile("codex", rules=(
        RoleRule("compaction", "meta:request_kind", r"^compaction$"),
        RoleRule("subagent", "meta:thread_source", r"^subagent$"),
        RoleRule("auxiliary", "meta:request_kind", r"^(?!turn$)"),
        # Without metadata (another client of the Responses API): Codex's own compaction prompt.
        RoleRule("compaction", "last_user", r"CONTEXT CHECKPOINT COMPACTION"),
    )),
    # clawjax's own harness (clawjax/harness/mini): its summarising call has a system prompt of its own.
    "mini": HarnessProfile("mini", rules=(
        RoleRule("compaction", "system", r"^You are mini's context summariser"),
    )),
}
# Harnesses without a profile (e.g. a minimal test harness) log every call as main.
GENERIC = HarnessProfile("generic")


def profile_for(harness: str) -> HarnessProfile:
  return PROFILES.get(harness, GENERIC)


def load_profiles(path: str) -> dict[str, HarnessProfile]:
  """Reads {harness: {"default_role": ..., "rules": [{role, place, pattern, has_tools}]}} from JSON."""
  with open(path, encoding="utf-8") as fh:
    data: Any = json.load(fh)
  out = {}
  for name, spec in data.items():
    try:
      rules = tuple(RoleRule(**r) for r in spec.get("rules", []))
      out[name] = HarnessProfile(name, rules, spec.get("default_role", "main"))
    except (TypeError, ValueError, re.error, AttributeError) as e:
      raise ValueError(f"{path}: profile {name!r}: {e}") from None
  return out
