"""Harness adapters: how to install each harness, and the command line + env pointing it at a rollout.

An adapter produces a `HarnessCommand` (argv, env, the host paths it must read) for one rollout's shim
URL and key; `clawjax.harness.sandbox` runs it with the workspace as working directory and a
throwaway HOME, and kills its process group on timeout. Env and flags are each harness's headless mode
(Claude Code's `-p`, OpenClaw's `agent exec`), pointed at the shim.

  claude_code  Anthropic Messages, `claude -p` headless (npm @anthropic-ai/claude-code)
  openclaw     OpenAI Chat Completions, `openclaw agent exec` (npm openclaw on Node 24)
  codex        OpenAI Responses, `codex exec` (npm @openai/codex; its CODEX_HOME: clawjax/harness/codex.py)
  mini         OpenAI Chat Completions, `python -m clawjax.harness.mini` (ships with clawjax)
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import pathlib
import logging
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

from clawjax.config import Count, NonNegative, Positive
from clawjax.harness import codex, install

log = logging.getLogger(__name__)

_BASE_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclasses.dataclass(frozen=True)
class HarnessOptions:
  model: str = "policy"      # the model name the harness sends (the shim serves whatever it loaded)
  max_turns: Count = 30      # the harness's own agent-turn limit
  timeout_s: Positive[float] = 1800.0  # the harness's own deadline, where it has one (OpenClaw --timeout)
  # Claude Code's CLAUDE_CODE_MAX_RETRIES (its default of 10 retries spends minutes on a dead backend).
  claude_max_retries: NonNegative[int] = 2
  # OpenClaw model entry maxTokens (the shim caps generations server-side anyway).
  openclaw_max_tokens: Count = 8192
  # Prompt + generation tokens the model takes. None: the shim's limit, from its POST /rollouts answer
  # (what `run_rollout` fills in); smaller makes the harness compact earlier. Told to Claude Code
  # (CLAUDE_CODE_MAX_CONTEXT_TOKENS), OpenClaw (the model's contextWindow) and Codex (its model
  # catalog): for a model name they do not know, Claude Code assumes 1M tokens, Codex and OpenClaw
  # their own defaults, so none would compact before the shim's "prompt is too long", which ends the run.
  context_window: Positive[int] | None = None
  # Codex's request_max_retries and stream_max_retries (its defaults, 4 and 5, spend minutes on a dead
  # backend).
  codex_max_retries: NonNegative[int] = 2
  # Codex compacts once its context passes context_window less this: a generation of the shim's
  # default 8,192 tokens plus two tool outputs at Codex's cut of 10,000 bytes (~2.5K tokens each),
  # rounded up. Not published.
  codex_compact_reserve: NonNegative[int] = 16_384
  # Codex compacts remotely (its remote_compaction_v2 beta, answered by the shim) instead of asking the
  # model for a summary in a normal call; see clawjax/harness/codex.py.
  codex_remote_compaction: bool = False
  # Extra `--flag value` arguments for the mini harness (see `python -m clawjax.harness.mini --help`).
  mini_args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class HarnessCommand:
  argv: list[str]
  env: dict[str, str]
  ro_paths: list[pathlib.Path]  # host paths the harness reads (its install), visible in the sandbox


class Adapter(abc.ABC):
  # The harness's one name: the adapter key, the name registered with the shim and written in the call
  # log (it selects the shim's harness profile), e.g. "claude_code".
  name: str
  # The smallest context (tokens a call may hold) the harness was seen to work in, and why (its own
  # prompt, its own checks); 0: not known. A run with a smaller one stops at its start (`context_problem`).
  min_context: int = 0
  min_context_why: str = ""

  def install(self) -> None:
    """Installs the harness if needed (idempotent); raises install.NpmUnreachable without npm."""

  @abc.abstractmethod
  def command(self, base_url: str, api_key: str, prompt: str, home: pathlib.Path,
              options: HarnessOptions) -> HarnessCommand:
    """The command for one rollout; may write config files under the throwaway `home`."""

  def transcript_files(self, home: pathlib.Path) -> list[pathlib.Path]:
    """The harness's own JSONL session transcript(s) left under `home` after a run."""
    return []

  def transcript(self, home: pathlib.Path) -> list[Any]:
    """The harness's session transcript as a list of JSON objects (what PinchBench checkers read)."""
    out = []
    for f in self.transcript_files(home):
      for line in f.read_text(errors="replace").splitlines():
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          continue
    return out

  def result(self, stdout: str) -> dict[str, Any] | None:
    """The harness's final JSON output (the last stdout line that is a JSON object), if any."""
    for line in reversed(stdout.splitlines()):
      line = line.strip()
      if line.startswith("{"):
        try:
          return json.loads(line)
        except json.JSONDecodeError:
          continue
    try:  # pretty-printed (multi-line) JSON
      obj = json.loads(stdout[stdout.index("{"):])
    except ValueError:
      return None
    return obj if isinstance(obj, dict) else None

  def last_words(self, stdout: str, stderr: str, limit: int = 300) -> str | None:
    """The harness's own account of how it ended, for a failed rollout's reason: the error its JSON
    result reports (Claude Code's `result` when `is_error`, OpenClaw's `error.message`), else its last
    stderr line, else its last stdout line; "<where>: <text>", one line of at most `limit` characters."""
    result = self.result(stdout) or {}
    error = result.get("error")
    said = [result.get("result") if result.get("is_error") else None,
            error.get("message") if isinstance(error, dict) else error]
    said = next((s for s in said if isinstance(s, str) and s.strip()), None)
    if said is not None:
      return f"error: {' '.join(said.split())[:limit]}"
    for where, text in (("stderr", stderr), ("stdout", stdout)):
      lines = [line.strip() for line in text.splitlines() if line.strip()]
      if lines:
        return f"{where}: {lines[-1][:limit]}"
    return None


def _path_env(*dirs: pathlib.Path) -> str:
  return ":".join([*map(str, dirs), *_BASE_PATH])


class ClaudeCode(Adapter):
  name = "claude_code"
  # 2.1.332, told 26,000 and below, answered every task "Prompt is too long" before any model call; at
  # 27,000 it ran (Qwen3 and SmolLM2 tokenizers alike: its own estimate decides).
  min_context = 27_000
  min_context_why = "its own prompt is ~12K tokens, and with less it ends every task with \"Prompt is too long\""

  def install(self) -> None:
    install.install_claude_code()

  def command(self, base_url, api_key, prompt, home, options):
    exe = install.install_claude_code()
    env = {
        "ANTHROPIC_BASE_URL": base_url, "ANTHROPIC_API_KEY": api_key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1", "IS_SANDBOX": "1",
        "CLAUDE_CODE_MAX_RETRIES": str(options.claude_max_retries), "PATH": _path_env(exe.parent),
    }
    if options.context_window is not None:
      # It then compacts once the context passes this less 33K (its output and summary reserves).
      env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(options.context_window)
    argv = [str(exe), "-p", prompt, "--dangerously-skip-permissions", "--output-format", "json",
            "--max-turns", str(options.max_turns), "--model", options.model]
    return HarnessCommand(argv, env, [install.CLAUDE_CODE.prefix()])

  def transcript_files(self, home):
    return sorted((home / ".claude" / "projects").glob("*/*.jsonl"))


class OpenClaw(Adapter):
  name = "openclaw"
  # 2026.9.6 trims its prompt to a small window, down to 7,432 (Qwen3) / 7,913 (SmolLM2) tokens.
  min_context = 7_400
  min_context_why = "its own prompt, trimmed to fit, is ~7.4K-7.9K tokens"

  def install(self) -> None:
    install.install_openclaw()

  def command(self, base_url, api_key, prompt, home, options):
    exe, node_bin = install.install_openclaw()
    model = {"id": options.model, "name": options.model, "maxTokens": options.openclaw_max_tokens}
    if options.context_window is not None:
      model["contextWindow"] = options.context_window  # (It then trims tool results to fit.)
    config = {
        "models": {"providers": {"local": {
            "baseUrl": base_url.rstrip("/") + "/v1", "apiKey": api_key, "api": "openai-completions",
            "models": [model]}}},
        "agents": {"defaults": {"model": {"primary": f"local/{options.model}"}}},
    }
    config_path = home / "openclaw.json5"
    config_path.write_text(json.dumps(config, indent=2))
    state = home / ".openclaw-state"  # kept (exec deletes a state dir it made itself)
    state.mkdir(exist_ok=True)
    argv = [str(exe), "agent", "exec", prompt, "--config", str(config_path), "--json",
            "--timeout", str(int(options.timeout_s)), "--state-dir", str(state)]
    env = {"PATH": _path_env(node_bin)}
    return HarnessCommand(argv, env, [install.NODE24.prefix(), install.OPENCLAW.prefix()])

  def transcript(self, home):
    # OpenClaw 2026.9 keeps its session events (the JSONL session format, one JSON object per event)
    # in SQLite under the state dir; zstd-compressed rows (event_json NULL) are left out.
    out = []
    for db in sorted((home / ".openclaw-state" / "agents").glob("*/agent/openclaw-agent.sqlite")):
      try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
          rows = conn.execute("SELECT event_json FROM transcript_events "
                              "WHERE event_json IS NOT NULL ORDER BY session_id, seq").fetchall()
      except sqlite3.Error as e:  # another OpenClaw version's layout: score without a transcript
        log.warning("cannot read OpenClaw's transcript from %s: %s", db, e)
        continue
      out.extend(json.loads(r[0]) for r in rows)
    return out


class Codex(Adapter):
  name = "codex"
  min_context = 10_000
  min_context_why = "its own prompt (instructions, environment and ~17.8K characters of tools) is ~9K tokens"

  def install(self) -> None:
    codex.fallback_instructions(install.install_codex())

  def command(self, base_url, api_key, prompt, home, options):
    exe = install.install_codex()
    codex_home = home / ".codex"
    codex.write_home(codex_home, base_url, options.model, codex.fallback_instructions(exe),
                     options.context_window, options.codex_compact_reserve, options.codex_max_retries,
                     options.codex_remote_compaction)
    node = codex.node_dir()
    env = {"CODEX_HOME": str(codex_home), codex.KEY_ENV: api_key, "PATH": _path_env(node)}
    return HarnessCommand(codex.argv(exe, prompt), env, [install.CODEX.prefix(), node.parent])

  def transcript_files(self, home):
    return codex.transcript_files(home)


class Mini(Adapter):
  name = "mini"
  min_context = 400  # its prompt with a short task: 435 (SmolLM2) / 534 (Qwen3) tokens
  min_context_why = "its own prompt is ~450 tokens"

  def command(self, base_url, api_key, prompt, home, options):
    argv = [sys.executable, "-P", "-m", "clawjax.harness.mini", "--base-url", base_url,
            "--api-key", api_key, "--task", prompt, "--workspace", ".",
            "--model", options.model, "--max-turns", str(options.max_turns),
            "--transcript", str(home / ".mini" / "transcript.jsonl"), *options.mini_args]
    return HarnessCommand(argv, {"PATH": _path_env(), "PYTHONUNBUFFERED": "1"}, [])

  def transcript_files(self, home):
    return [p for p in [home / ".mini" / "transcript.jsonl"] if p.exists()]


ADAPTERS: dict[str, Adapter] = {a.name: a for a in (ClaudeCode(), OpenClaw(), Codex(), Mini())}


def get_adapter(name: str) -> Adapter:
  try:
    return ADAPTERS[name]
  except KeyError:
    raise ValueError(f"unknown harness {name!r}; choose from {sorted(ADAPTERS)}") from None


def context_problem(names: Sequence[str], window: int, source: str) -> str | None:
  """Why a harness of `names` cannot work where a call holds at most `window` tokens (`source`: the
  settings that say so), or None."""
  for name in names:
    adapter = get_adapter(name)
    if window < adapter.min_context:
      return (f"{name} needs a context of at least {adapter.min_context:,} tokens ({adapter.min_context_why}), "
              f"but a call holds at most {window:,} here ({source}): raise that, or leave {name} out")
  return None
