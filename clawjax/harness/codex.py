"""Codex CLI (npm @openai/codex) pointed at the shim: its per-rollout CODEX_HOME and command line.

A rollout's Codex reads `HOME/.codex/` (CODEX_HOME): config.toml names a model provider whose
base_url is the shim's per-rollout URL + `/v1`, `wire_api = "responses"` (POST /v1/responses), the
rollout's key from CLAWJAX_API_KEY (`env_key`), and a model catalog (`model_catalog_json`) with one
entry for the served model: its context window (the shim's limit) and the context length from which
Codex compacts (`auto_compact_token_limit`: the window less `compact_reserve`), so Codex neither warns
that the model is unknown nor assumes the fallback metadata's window. The entry's instructions are
the ones Codex itself uses for a model it does not know (its built-in prompt), read once per install
from the first request a Codex with no catalog sends (`fallback_instructions`), so the catalog changes
the metadata and nothing of the prompt. Its own sandbox and approvals are off
(`--dangerously-bypass-approvals-and-sandbox`): it runs inside clawjax's (bubblewrap, network only to
the shim); analytics, the update check and its endless reconnecting are off. `codex exec --json`
prints its events as JSONL; its session transcript is `CODEX_HOME/sessions/**/rollout-*.jsonl`. Codex
has no turn limit of its own: the rollout's timeout bounds it.

Compaction: with a provider of its own name Codex compacts locally (a /v1/responses call whose last user
message asks for a handoff summary, request_kind "compaction"); `remote_compaction` names the provider
"OpenAI", for which Codex 0.169 compacts remotely (its remote_compaction_v2: a compaction_trigger item,
answered by the shim, clawjax/serving/openai_responses.py).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
from typing import Any

from clawjax.harness import install

KEY_ENV = "CLAWJAX_API_KEY"
PROVIDER = "clawjax"
_CATALOG = "clawjax-models.json"
_INSTRUCTIONS = "clawjax-fallback-instructions.txt"  # In the install's prefix.
PROBE_TIMEOUT_S = 120.0
# What Codex 0.169 gives a model it does not know (its fallback metadata), kept in the catalog entry
# but for the window, the compaction limit, the instructions and the visibility (listed, where the
# fallback's is none): the shell tool `unified_exec`, tool output cut at 10,000 bytes, 95% of the window
# counted as usable, no reasoning levels.
_ENTRY = {"supported_reasoning_levels": [], "shell_type": "unified_exec", "visibility": "list",
          "supported_in_api": True, "priority": 99, "support_verbosity": False,
          "truncation_policy": {"mode": "bytes", "limit": 10_000}, "experimental_supported_tools": [],
          "effective_context_window_percent": 95}


def _toml(value: Any) -> str:
  """A TOML value: strings as JSON writes them (TOML basic strings share its escapes)."""
  if isinstance(value, bool):
    return "true" if value else "false"
  return json.dumps(value) if isinstance(value, str) else str(value)


def _config(provider: dict[str, Any], top: dict[str, Any]) -> str:
  lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
  # Its "unbounded_connection_retries" (on in 0.169) retries a refused connection forever, not the
  # provider's request_max_retries times: a rollout whose shim is gone would wait for its timeout.
  lines += ["", "[features]", "unbounded_connection_retries = false", "", "[analytics]",
            "enabled = false", "", f"[model_providers.{PROVIDER}]"]
  return "\n".join(lines + [f"{k} = {_toml(v)}" for k, v in provider.items()]) + "\n"


def _provider(base_url: str, retries: int, remote_compaction: bool) -> dict[str, Any]:
  return {"name": "OpenAI" if remote_compaction else PROVIDER, "base_url": base_url.rstrip("/") + "/v1",
          "env_key": KEY_ENV, "wire_api": "responses", "request_max_retries": retries,
          "stream_max_retries": retries}


def _settings(model: str, codex_home: pathlib.Path) -> dict[str, Any]:
  return {"model": model, "model_provider": PROVIDER, "approval_policy": "never",
          "sandbox_mode": "danger-full-access", "check_for_update_on_startup": False,
          "model_catalog_json": str(codex_home / _CATALOG)}


def write_home(codex_home: pathlib.Path, base_url: str, model: str, instructions: str,
               context_window: int | None, compact_reserve: int, retries: int,
               remote_compaction: bool = False) -> None:
  """Writes config.toml and the model catalog of one rollout's CODEX_HOME."""
  codex_home.mkdir(parents=True, exist_ok=True)
  entry = {"slug": model, "display_name": model, **_ENTRY, "base_instructions": instructions}
  if context_window is not None:
    if not 0 <= compact_reserve < context_window:
      raise ValueError(f"HarnessOptions.codex_compact_reserve={compact_reserve}: must be at least 0 and "
                       f"below the {context_window}-token window")
    entry.update(context_window=context_window, auto_compact_token_limit=context_window - compact_reserve)
  (codex_home / _CATALOG).write_text(json.dumps({"models": [entry]}, indent=1))
  (codex_home / "config.toml").write_text(_config(_provider(base_url, retries, remote_compaction),
                                                  _settings(model, codex_home)))


def argv(exe: pathlib.Path, prompt: str) -> list[str]:
  return [str(exe), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
          "--json", "--", prompt]


def node_dir() -> pathlib.Path:
  """The directory of the `node` that runs Codex's launcher (Node >= 16)."""
  node = shutil.which("node")
  if node is None:
    raise install.InstallError("codex: its launcher needs Node.js (node) on PATH")
  return pathlib.Path(node).resolve().parent


def transcript_files(home: pathlib.Path) -> list[pathlib.Path]:
  return sorted((home / ".codex" / "sessions").glob("**/rollout-*.jsonl"))


class _FirstRequest(http.server.BaseHTTPRequestHandler):
  """Keeps the first POST body it gets and answers every request 400 (Codex then exits)."""
  bodies: list[bytes]

  def do_POST(self):  # pylint: disable=invalid-name
    self.bodies.append(self.rfile.read(int(self.headers.get("content-length") or 0)))
    body = b'{"error": {"message": "clawjax: probe only", "type": "invalid_request_error"}}'
    self.send_response(400)
    self.send_header("content-type", "application/json")
    self.send_header("content-length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def log_message(self, *args):  # Quiet.
    pass


def _instructions_of(body: bytes) -> str:
  """A Responses request's base instructions: its `instructions`, else its first developer message."""
  request = json.loads(body)
  if request.get("instructions"):
    return request["instructions"]
  for item in request.get("input", []):
    if item.get("role") == "developer":
      return "\n".join(p.get("text", "") for p in item.get("content", []))
  raise install.InstallError("codex: its first request holds no instructions")


def _probe(exe: pathlib.Path) -> str:
  """Runs Codex once, with no catalog, against a local endpoint that keeps its first request."""
  handler = type("Handler", (_FirstRequest,), {"bodies": []})
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    with tempfile.TemporaryDirectory(prefix="clawjax-codex-probe-") as tmp:
      home = pathlib.Path(tmp)
      codex_home = home / ".codex"
      codex_home.mkdir()
      settings = {k: v for k, v in _settings("policy", codex_home).items() if k != "model_catalog_json"}
      (codex_home / "config.toml").write_text(_config(
          _provider(f"http://127.0.0.1:{server.server_address[1]}", 0, False), settings))
      env = {"HOME": tmp, "CODEX_HOME": str(codex_home), KEY_ENV: "probe",
             "PATH": os.pathsep.join([str(node_dir()), "/usr/bin", "/bin"])}
      try:
        proc = subprocess.run(argv(exe, "probe"), cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
      except subprocess.TimeoutExpired:
        raise install.InstallError(f"codex: the probe run did not end in {PROBE_TIMEOUT_S:.0f} s") from None
  finally:
    server.shutdown()
    server.server_close()
  if not handler.bodies:
    raise install.InstallError(f"codex: the probe run sent no request (exit {proc.returncode}):\n"
                               f"{proc.stderr[-2000:]}")
  return _instructions_of(handler.bodies[0])


def fallback_instructions(exe: pathlib.Path) -> str:
  """Codex's instructions for a model it has no metadata for, probed once per install and kept in the
  install's prefix (written whole or not at all: concurrent rollouts may probe at once)."""
  cache = install.CODEX.prefix() / _INSTRUCTIONS
  if not cache.exists():
    text = _probe(exe)
    with tempfile.NamedTemporaryFile("w", dir=cache.parent, delete=False, suffix=".tmp",
                                     encoding="utf-8") as fh:
      fh.write(text)
    with contextlib.suppress(FileExistsError):
      os.replace(fh.name, cache)
  return cache.read_text(encoding="utf-8")
