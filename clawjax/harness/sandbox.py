"""Runs a harness command isolated with bubblewrap, or says plainly that it could not.

With bubblewrap (`apt-get install -y bubblewrap`) the command sees a minimal root: the system
directories and the paths it needs (its install dir, the Python running clawjax, the clawjax package
this process imported) read-only, its workspace and a throwaway HOME writable, a fresh /tmp, its own PID
namespace, and its own network namespace holding only a loopback interface. The shim's ports are
relayed into that loopback through Unix sockets (see relay.py), so the harness reaches the shim at its
usual 127.0.0.1 URL and nothing else: no outside network, no other local service. Nothing of the
host's file tree outside those paths exists for it (task checkers, call logs, other rollouts'
workspaces).

Without bubblewrap, or when it cannot create namespaces here, `mode="auto"` falls back to a plain
subprocess in its own process group, with a warning in the log (once per process) and
`SandboxResult.sandbox == "none"` in every result: the workspace is then only the working directory,
the file system and network are the host's. Runs that need the isolation use `mode="bwrap"`, which
refuses to run without it (`SandboxError`, naming the install command); `isolation(config)` says before
a run what its rollouts will run under, with the fields each rollout record carries.

Python inside (the relay, the mini harness) imports the clawjax this process imported, which comes
first on PYTHONPATH there in either mode: a venv's editable install may name another checkout.

Relay sockets live in this run's dir under the system temp dir (see rundirs.py), so a killed run's are
removed by the next start.

On timeout the whole process group is killed (SIGKILL); under bubblewrap the PID namespace guarantees
that every descendant dies with it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any

from clawjax.config import NonNegative
from clawjax.harness import relay, rundirs

log = logging.getLogger(__name__)

# Read-only inside every sandbox when they exist on the host: what dynamically linked programs,
# shells, CA bundles and DNS configuration live in.
SYSTEM_RO_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
_RELAY_DIR = "/run/clawjax-relay"
INSTALL_HINT = "apt-get install -y bubblewrap"


class SandboxError(RuntimeError):
  """bubblewrap was required (mode="bwrap") but cannot run here."""


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  # "auto": bubblewrap when it works here, else a plain subprocess (logged, and recorded in the
  # result); "bwrap": bubblewrap or an error; "none": always a plain subprocess.
  mode: str = "auto"
  # Give the sandbox its own network namespace (loopback only, shim ports relayed in). False shares
  # the host's network: every address is reachable.
  isolate_network: bool = True
  # Extra host paths visible read-only inside, beyond SYSTEM_RO_PATHS and the per-run paths.
  extra_ro_paths: tuple[str, ...] = ()
  # Host paths that must not be readable inside even when under a visible path (besides the per-run
  # `SandboxSpec.hidden_paths` and clawjax's bundled task data): each is replaced by an empty one.
  extra_hidden_paths: tuple[str, ...] = ()
  # Grace between SIGTERM and SIGKILL when a run times out.
  kill_grace_s: NonNegative[float] = 2.0

  def __post_init__(self):
    if self.mode not in ("auto", "bwrap", "none"):
      raise ValueError(f"SandboxConfig.mode: {self.mode!r} is not one of 'auto', 'bwrap', 'none'")


@dataclasses.dataclass(frozen=True)
class SandboxSpec:
  """One command to run: `argv` in `workspace` with `env` (nothing of the caller's env leaks in)."""
  argv: Sequence[str]
  workspace: pathlib.Path
  home: pathlib.Path
  env: dict[str, str]
  timeout_s: float
  stdout_path: pathlib.Path
  stderr_path: pathlib.Path
  ro_paths: Sequence[pathlib.Path] = ()  # host paths the command needs to read (install dirs)
  loopback_ports: Sequence[int] = ()     # 127.0.0.1 ports reachable from inside (the shim)
  # Where the workspace appears inside a bwrap sandbox (a task's mount dir, e.g.
  # /root/.openclaw/workspace); None: at its host path. A plain subprocess always uses the host path.
  workspace_mount: str | None = None
  # Host paths shown empty inside (a task's source, which holds its checker).
  hidden_paths: Sequence[pathlib.Path] = ()


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  returncode: int | None   # None when killed on timeout
  timed_out: bool
  wall_s: float
  sandbox: str             # "bwrap" or "none"
  network: str             # "loopback-relay" (only the relayed ports), "host" (everything)
  fallback_reason: str | None  # why a "none" sandbox was used, when it was not asked for
  mode: str                # the SandboxConfig.mode asked for

  def isolation(self) -> dict[str, Any]:
    """The isolation this ran under, as rollout records and run summaries carry it (see `isolation`)."""
    return {"sandbox_mode": self.mode, "sandbox": self.sandbox, "network": self.network,
            "sandbox_fallback": self.fallback_reason}


@functools.cache
def bwrap_problem() -> str | None:
  """None when bubblewrap can create the namespaces used here; else the reason it cannot."""
  exe = shutil.which("bwrap")
  if exe is None:
    return f"bwrap not found on PATH (Debian: {INSTALL_HINT})"
  try:
    proc = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                          capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.TimeoutExpired) as e:
    return f"bwrap probe failed: {e}"
  if proc.returncode != 0:
    return f"bwrap cannot create namespaces here: {proc.stderr.strip()[-500:]}"
  return None


def isolation(config: SandboxConfig) -> dict[str, Any]:
  """What harnesses run under with `config` on this host, as the fields each rollout record's `extra`
  carries: sandbox_mode (asked), sandbox ("bwrap" / "none"), network ("loopback-relay" / "host"),
  sandbox_fallback (why "auto" fell back, else None). Raises SandboxError for mode="bwrap" without a
  working bubblewrap: call it at the start of a run to fail before any rollout."""
  problem = None if config.mode == "none" else bwrap_problem()
  if problem and config.mode == "bwrap":
    raise SandboxError(f"SandboxConfig.mode='bwrap' but {problem}. Install bubblewrap (`{INSTALL_HINT}` on "
                       "Debian/Ubuntu, as root) on a host that lets it create user namespaces, or choose "
                       "mode='auto' / 'none' to run harnesses without isolation")
  use_bwrap = config.mode != "none" and problem is None
  return {"sandbox_mode": config.mode, "sandbox": "bwrap" if use_bwrap else "none",
          "network": "loopback-relay" if use_bwrap and config.isolate_network else "host",
          "sandbox_fallback": problem}


def _clawjax_dir() -> pathlib.Path:
  import clawjax
  return pathlib.Path(clawjax.__file__).resolve().parent


def _python_path(env: dict[str, str]) -> str:
  """PYTHONPATH inside: the clawjax this process imports first. Without it Python resolves `clawjax`
  through the venv, whose editable install may name another checkout (not mounted under bwrap: "No
  module named 'clawjax'"; without bwrap, silently that checkout's code)."""
  return os.pathsep.join([str(_clawjax_dir().parent), *filter(None, [env.get("PYTHONPATH")])])


def python_ro_paths() -> list[pathlib.Path]:
  """What a sandbox needs to run `sys.executable -m clawjax...`: the interpreter, the venv, clawjax."""
  return [pathlib.Path(sys.base_prefix).resolve(), pathlib.Path(sys.prefix), _clawjax_dir()]


def _hide(paths: Sequence[os.PathLike | str]) -> list[str]:
  """bwrap arguments replacing each existing path by an empty directory or file."""
  argv = []
  for p in _existing(paths):
    argv += ["--tmpfs", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
  return argv


def _existing(paths: Sequence[os.PathLike | str]) -> list[str]:
  return [os.fspath(p) for p in dict.fromkeys(map(os.fspath, paths)) if os.path.exists(p)]


def _bwrap_argv(spec: SandboxSpec, env: dict[str, str], config: SandboxConfig,
                relay_dir: str | None) -> list[str]:
  argv = [shutil.which("bwrap"), "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
  if not config.isolate_network:
    argv.append("--share-net")
  # The fresh /tmp first: binds below may lie under /tmp (a checkout or venv there) and must stay on top.
  argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
  for p in _existing([*SYSTEM_RO_PATHS, *config.extra_ro_paths, *python_ro_paths(), *spec.ro_paths]):
    argv += ["--ro-bind", p, p]
  # Task data bundled with clawjax holds checkers: never visible to the harness.
  argv += _hide([_clawjax_dir() / "data", *config.extra_hidden_paths, *spec.hidden_paths])
  inside_ws = spec.workspace_mount or str(spec.workspace)
  argv += ["--bind", str(spec.home), str(spec.home), "--bind", str(spec.workspace), inside_ws]
  if relay_dir is not None:
    argv += ["--bind", relay_dir, _RELAY_DIR]
  for k, v in env.items():
    argv += ["--setenv", k, v]
  argv += ["--chdir", inside_ws, "--"]
  if relay_dir is not None:
    argv += [sys.executable, "-P", "-m", "clawjax.harness.relay"]  # -P: the workspace never shadows
    argv += [f"--port={p}={_RELAY_DIR}/{p}.sock" for p in spec.loopback_ports]
    argv.append("--")
  return argv + list(spec.argv)


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
  for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(wait_s)
      return
    except subprocess.TimeoutExpired:
      continue


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_fallback(reason: str) -> None:
  """Once per process and reason (each rollout record says it too): a run's log is not 800 copies of it."""
  with _warned_lock:
    if reason in _warned:
      return
    _warned.add(reason)
  log.warning("harness sandbox: falling back to a plain subprocess (no isolation): %s", reason)


def run(spec: SandboxSpec, config: SandboxConfig = SandboxConfig()) -> SandboxResult:
  """Runs `spec` to completion or timeout; stdout/stderr go to the spec's files."""
  iso = isolation(config)
  use_bwrap = iso["sandbox"] == "bwrap"
  if iso["sandbox_fallback"]:
    _warn_fallback(iso["sandbox_fallback"])
  env = {"HOME": str(spec.home), **spec.env, "PYTHONPATH": _python_path(spec.env)}
  # Relay only when the network is isolated; a shared network reaches the shim directly.
  relayed = use_bwrap and config.isolate_network and bool(spec.loopback_ports)
  with ExitStack() as stack:
    relay_dir = None
    if relayed:
      relay_dir = stack.enter_context(tempfile.TemporaryDirectory(
          prefix="r-", dir=rundirs.current_run().dir(rundirs.relays_root())))
      for port in spec.loopback_ports:
        stack.enter_context(relay.UnixToTcp(f"{relay_dir}/{port}.sock", port))
    if use_bwrap:
      argv, cwd, proc_env = _bwrap_argv(spec, env, config, relay_dir), None, {"PATH": os.environ["PATH"]}
    else:
      argv, cwd, proc_env = list(spec.argv), str(spec.workspace), env
    t0 = time.monotonic()
    with open(spec.stdout_path, "wb") as out, open(spec.stderr_path, "wb") as err:
      proc = subprocess.Popen(argv, cwd=cwd, env=proc_env, stdin=subprocess.DEVNULL, stdout=out,
                              stderr=err, start_new_session=True)
      timed_out = False
      try:
        proc.wait(spec.timeout_s)
      except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc, config.kill_grace_s)
      except BaseException:
        _kill_group(proc, 0.0)
        raise
  return SandboxResult(
      returncode=None if timed_out else proc.returncode, timed_out=timed_out,
      wall_s=time.monotonic() - t0, sandbox=iso["sandbox"], network=iso["network"],
      fallback_reason=iso["sandbox_fallback"], mode=config.mode)
