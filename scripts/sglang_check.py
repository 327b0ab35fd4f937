"""Real SGLang (its CUDA build) against clawjax's client side: served log-probs of a sampled continuation
against the model's own, then one `/update_weights_from_disk` push of moved weights, exported as the trainer
exports them: its seconds, the weight_version read back, and the log-probs again under the new weights;
then a push while a long call is in flight (SGLang holds new calls and drains it) and one that aborts it
(`abort_all_requests`: the client must take the abort for a retryable error).

SGLang honours a request's `sampling_seed` only when started with `--enable-deterministic-inference`
(otherwise it ignores it, silently): the check starts it so, and records whether one seed sampled the
same tokens twice. A run that wants reproducible sampling needs the flag on its servers too.

  python scripts/sglang_check.py --sglang-python VENV/bin/python --workdir DIR [--budget-s 300]
  python scripts/sglang_check.py --relock-sglang    # rewrite third_party/sglang-cuda/requirements.txt

It needs a GPU machine that can install SGLang: `python -m venv VENV && VENV/bin/pip install
--require-hashes --no-deps --only-binary=:all: -r third_party/sglang-cuda/requirements.txt` (several GB
of CUDA wheels, pinned with their hashes). The accelerator check (scripts/device_check.sh) leaves it out:
a lent machine reaches no registry. The client flow is checked on the CPU against clawjax's own engine
server, which speaks SGLang's API (tests/benchmarks/test_device_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
SGLANG_SPEC = "sglang==0.5.23"
SGLANG_LOCK = ROOT / "third_party" / "sglang-cuda" / "requirements.txt"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _logprob_diff(model, prompt: list[int], generation) -> dict[str, float]:
  """The engine's log-probs of its sampled tokens against the model's own (log softmax at T = 1)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from clawjax.models.model import causal_inputs  # pylint: disable=import-outside-toplevel
  ids = list(prompt) + list(generation.output_ids)
  logits = model(*causal_inputs(jnp.asarray([ids], jnp.int32)))[0].astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  ours = np.asarray(logp[np.arange(len(prompt) - 1, len(ids) - 1), np.asarray(generation.output_ids)])
  diff = np.abs(ours - np.asarray(generation.output_logprobs))
  return {"tokens": len(generation.output_ids), "max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean())}


async def _push_under_load(backend, path: str, version: int, abort: bool, out: dict[str, Any]) -> None:
  """A push while a long call is in flight: whether the call still ran when the push went out, the push's
  seconds, the version read back, and how the call ended (finished on `version - 1`, or aborted: then
  the client's error must be retryable)."""
  import asyncio  # pylint: disable=import-outside-toplevel
  from clawjax.generation import SamplingParams  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends.base import BackendError, PromptIds  # pylint: disable=import-outside-toplevel
  long = asyncio.create_task(backend.generate(PromptIds(list(range(2000, 2064))),
                                              SamplingParams(max_new_tokens=512, temperature=1.0, seed=1)))
  await asyncio.sleep(0.5)
  record: dict[str, Any] = {"call_in_flight": not long.done()}
  start = time.monotonic()
  record["version_read_back"] = await backend.update_weights_from_disk(path, version, abort=abort)
  record["push_s"] = time.monotonic() - start
  try:
    record["call_version"] = (await long).policy_version
  except BackendError as e:
    record["call_error"] = {"retryable": e.overloaded, "message": str(e)[:200]}
  out["push_aborting" if abort else "push_draining"] = record


async def _exchange(backend, model, workdir: pathlib.Path, out: dict[str, Any]) -> None:
  """Against the served weights: our backend's log-probs (and one seed's tokens twice), one push of
  moved weights (exported as the trainer's push exports them), its weight_version read back, the
  log-probs again; then the pushes under load. One event loop for all of it: the backend's HTTP session
  belongs to the loop that made it."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from clawjax.generation import SamplingParams  # pylint: disable=import-outside-toplevel
  from clawjax.models import hf_io  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends.base import PromptIds  # pylint: disable=import-outside-toplevel
  prompt = list(range(1000, 1064))
  params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
  try:
    first = await backend.generate(PromptIds(prompt), params)
    out["logprobs_v0"] = _logprob_diff(model, prompt, first)
    out["same_seed_same_tokens"] = (await backend.generate(PromptIds(prompt), params)).output_ids == first.output_ids
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    nnx.update(model, jax.tree.map(lambda x: x + 0.01 * jax.random.normal(next(keys), x.shape, x.dtype),
                                   nnx.state(model, nnx.Param)))
    start = time.monotonic()
    second = hf_io.save(model, workdir / "sglang_v1", dtype=hf_io.push_dtype(model.cfg))
    out["push_export_s"] = time.monotonic() - start
    out["push_bytes"] = sum(p.stat().st_size for p in second.glob("*.safetensors"))
    start = time.monotonic()
    out["weight_version_read_back"] = await backend.update_weights_from_disk(str(second), 1)
    out["update_weights_from_disk_s"] = time.monotonic() - start
    after = await backend.generate(PromptIds(prompt), params)
    out["generation_policy_version"] = after.policy_version
    out["logprobs_v1"] = _logprob_diff(model, prompt, after)
    await _push_under_load(backend, str(second), 2, False, out)
    await _push_under_load(backend, str(second), 3, True, out)
    aborted = out["push_aborting"].get("call_error", {"retryable": True})
    ok = (out["weight_version_read_back"] == 1 == after.policy_version and out["same_seed_same_tokens"]
          and out["push_draining"]["version_read_back"] == 2 and out["push_aborting"]["version_read_back"] == 3
          and out["push_draining"].get("call_version") == 1 and aborted["retryable"])
    out["status"] = "ok" if ok else "failed"
  finally:
    await backend.close()


def check_sglang(sglang_python: str, workdir: pathlib.Path, budget_s: float) -> dict[str, Any]:
  """Starts SGLang on a random-init Qwen3-0.6B export and runs `_exchange` against it; a failure is recorded
  with what was measured before it and the server log's tail."""
  if not pathlib.Path(sglang_python).exists():
    return {"status": "skipped", "reason": f"no SGLang interpreter at {sglang_python!r}"}
  import asyncio  # pylint: disable=import-outside-toplevel
  from clawjax.models import hf_io  # pylint: disable=import-outside-toplevel
  from clawjax.models.loading import load_model  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends.base import create_backend  # pylint: disable=import-outside-toplevel
  from clawjax.serving.vllm_cpu import wait_healthy  # pylint: disable=import-outside-toplevel
  deadline = time.monotonic() + budget_s - 10
  model = load_model("qwen3-0.6b", random_init=True, dtype="bfloat16", param_dtype="float32").model
  first = hf_io.save(model, workdir / "sglang_v0", dtype=hf_io.push_dtype(model.cfg))
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  log_path = workdir / "sglang_server.log"
  out: dict[str, Any] = {"model": "qwen3-0.6b (random init, bf16 export)", "server_log": str(log_path)}
  with open(log_path, "wb") as log:
    proc = subprocess.Popen([sglang_python, "-m", "sglang.launch_server", "--model-path", str(first),
                             "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
                             "--dtype", "bfloat16", "--mem-fraction-static", "0.3", "--disable-cuda-graph",
                             # Triton attention and torch sampling: FlashInfer may fetch kernels from
                             # outside, and only the package registries are reachable.
                             "--attention-backend", "triton", "--sampling-backend", "pytorch",
                             # A request's sampling_seed is ignored without it.
                             "--enable-deterministic-inference",
                             "--random-seed", "0"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
  try:
    start = time.monotonic()
    wait_healthy(proc, url, timeout_s=deadline - start, name="SGLang")
    out["startup_s"] = time.monotonic() - start
    asyncio.run(_exchange(create_backend("sglang", url=url), model, workdir, out))
  except Exception as e:  # pylint: disable=broad-except  (recorded with what was measured before it)
    out.update(status="failed", reason=f"{type(e).__name__}: {e}",
               server_log_tail=log_path.read_text(errors="replace")[-2000:])
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGTERM)
      try:
        proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
  return out


# ---- the SGLang lock --------------------------------------------------------------------------------

def relock_sglang() -> pathlib.Path:
  """Re-resolves SGLANG_SPEC with pip's resolver (`--dry-run --report`: metadata only, no multi-GB wheel
  downloaded) and writes every package with its version and wheel sha256 to SGLANG_LOCK."""
  with tempfile.TemporaryDirectory(prefix="clawjax-relock-") as tmp:
    report = pathlib.Path(tmp) / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "-q", "install", "--dry-run", "--ignore-installed",
                    "--only-binary=:all:", "--report", str(report), SGLANG_SPEC], check=True)
    items = json.loads(report.read_text())["install"]
  tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}-{platform.machine()}"
  lines = [f"# {SGLANG_SPEC} (PyPI's build: CUDA) and everything it needs, with the sha256 of each wheel.",
           "# Written by `python scripts/sglang_check.py --relock-sglang`; installed as its docstring says",
           "# (`pip install --require-hashes --no-deps`).", f"# resolved for: {tag}"]
  for item in sorted(items, key=lambda i: i["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    sha256 = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    if sha256 is None:
      raise ValueError(f"pip reported no sha256 for {name}=={version}")
    lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256}")
  SGLANG_LOCK.parent.mkdir(parents=True, exist_ok=True)
  SGLANG_LOCK.write_text("\n".join(lines) + "\n")
  return SGLANG_LOCK


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sglang-python", help="the interpreter of the SGLang CUDA venv")
  p.add_argument("--workdir", help="exports, the server's log and sglang_check.json")
  p.add_argument("--budget-s", type=float, default=300.0, help="seconds for the server's start and the exchange")
  p.add_argument("--relock-sglang", action="store_true", help=f"rewrite {SGLANG_LOCK.relative_to(ROOT)}")
  args = p.parse_args(argv)
  if args.relock_sglang:
    print(relock_sglang())
    return 0
  if not (args.sglang_python and args.workdir):
    p.error("--sglang-python and --workdir are required")
  workdir = pathlib.Path(args.workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  result = check_sglang(args.sglang_python, workdir, args.budget_s)
  (workdir / "sglang_check.json").write_text(json.dumps(result, indent=1) + "\n")
  print(json.dumps(result))
  return 0 if result.get("status") == "ok" else 1


if __name__ == "__main__":
  sys.exit(main())
