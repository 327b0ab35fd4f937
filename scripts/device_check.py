"""The accelerator check that scripts/device_check.sh runs: each part in its own process under a time
budget, its result or its failure recorded, one JSON written at the end.

  python scripts/device_check.py [--small] --out FILE [--sglang-python PY] [--install-report FILE]

Parts:
  learner_mfu    the learner's step on a random-init Qwen3 preset at 8K and 32K-token rows, tree layout
                 vs paths layout (benchmarks/learner_tree_vs_paths.py's data and FLOP count): step
                 seconds, model FLOPs (forward + backward = 3 x forward; rematerialisation not counted)
                 and MFU against the chip's dense bf16 peak.
  pallas         the same step at 8K with attention_impl "pallas" against "blocked" (step seconds, loss
                 difference); "unavailable" while no kernel of that name is registered.
  engine_decode  the embedded engine's decode tokens/s at 1 and 16 concurrent requests (qwen3-0.6b, bf16).
  sglang         real SGLang (its CUDA build): serves a random-init Qwen3 export (bf16, the push's dtype),
                 our sglang backend's log-probs of a sampled continuation against the model's own, then
                 one /update_weights_from_disk push of changed weights: its seconds, the weight_version
                 read back, and the log-probs again against the new weights.
--small: a tiny preset, short rows, the CPU backend, few tokens, SGLang skipped with its reason: what the
CPU test runs (tests/benchmarks/test_device_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
SGLANG_SPEC = "sglang==0.5.23"
SGLANG_LOCK = ROOT / "third_party" / "sglang-cuda" / "requirements.txt"
# In this order; a part gets its budget or what is left before the deadline, whichever is less (SGLang
# before the cheap decode part, so its background install has the most time and it the most budget).
PARTS = ("learner_mfu", "pallas", "sglang", "engine_decode")
# Seconds each part may take on the accelerator (the whole check has ~10 minutes, installs included).
BUDGET_S = {"learner_mfu": 170, "pallas": 80, "sglang": 200, "engine_decode": 50}
SMALL_BUDGET_S = 240  # a loaded 2-core machine compiles slowly; a quiet one takes ~10 s a part
# Dense bf16 peak FLOP/s by device kind (vendor datasheets; H100/H200 SXM without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12,
             "TPU v6 lite": 918e12}


def _sizes(small: bool) -> dict[str, Any]:
  if small:
    # One row length and one concurrency: each costs compiles, which the CPU test pays in full.
    return {"preset": "test-tiny", "layers": 1, "rows": (512,), "calls": 2, "engine_model": "test-tiny",
            "concurrency": (1,), "new_tokens": 4, "repeats": 1}
  return {"preset": "qwen3-8b", "layers": 4, "rows": (8192, 32768), "calls": 8, "engine_model": "qwen3-0.6b",
          "concurrency": (1, 16), "new_tokens": 64, "repeats": 2}


def _peak(device_kind: str) -> float | None:
  return next((peak for name, peak in PEAK_BF16.items() if name in device_kind), None)


# ---- learner_mfu and pallas -------------------------------------------------------------------------

def _group(row_len: int, calls: int, seed: int):
  """(tree batch, paths batch) of one GRPO group of two agent rollouts sharing a prompt, sized to fill
  about 85% of one `row_len` row in the tree layout."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from clawjax.rl.advantages import grpo_advantages  # pylint: disable=import-outside-toplevel
  from clawjax.tree import synthetic  # pylint: disable=import-outside-toplevel
  from clawjax.tree.filters import filter_rollout  # pylint: disable=import-outside-toplevel
  from clawjax.tree.pack import pack_paths, pack_trees  # pylint: disable=import-outside-toplevel
  prompt, per_call = row_len // 4, max(8, (row_len // 2) // (2 * calls))
  for _ in range(6):  # shrink the turns until the group fits
    calls_list, outcomes = synthetic.agent_group(
        np.random.default_rng(seed), task_id="check", n_rollouts=2, prompt_len=prompt, n_calls=calls,
        tokens_per_call=per_call, patterns=("thinking_stripped",), vocab_size=8192)
    by_rollout: dict[str, list] = {}
    for c in calls_list:
      by_rollout.setdefault(c.rollout_id, []).append(c)
    trees = [filter_rollout(rid, cs).tree for rid, cs in by_rollout.items()]
    size = sum(t.size for t in trees) - prompt
    if size <= 0.85 * row_len:
      scores = grpo_advantages(outcomes)
      return (pack_trees(trees, scores, row_len=row_len, share_prompts=True),
              pack_paths(trees, scores, row_len=row_len))
    per_call = int(per_call * 0.8 * row_len / size)
  raise ValueError(f"no group of {calls} calls fits a {row_len}-token row")


def _flops(cfg, batch) -> float:
  """Model FLOPs of one learner step on `batch`: 3 x the forward's (layers, attention pairs, logits)."""
  sys.path.insert(0, str(ROOT / "benchmarks"))
  from learner_tree_vs_paths import attended_pairs, layer_flops  # pylint: disable=import-outside-toplevel
  per_token, per_pair = layer_flops(cfg)
  tokens = float((batch.segment_ids_RT > 0).sum())
  logits = float((batch.unique_weight_RT > 0).sum()) * 2.0 * cfg.d_model * cfg.vocab_size
  return 3.0 * (cfg.n_layers * (tokens * per_token + attended_pairs(batch) * per_pair) + logits)


def _timed_steps(learner, batch, repeats: int) -> dict[str, float]:
  device_batch = learner.prepare(batch)
  start = time.perf_counter()
  first = learner.step(device_batch)
  compile_s = time.perf_counter() - start
  times = [learner.step(learner.prepare(batch))["step_seconds"] for _ in range(repeats)]
  return {"first_step_s": round(compile_s, 3), "step_s": statistics.median(times), "loss": float(first["loss"])}


def _learner(cfg_kwargs: dict, model_cfg, micro_batches: int):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from clawjax.models.model import Decoder  # pylint: disable=import-outside-toplevel
  from clawjax.rl.config import LearnerConfig  # pylint: disable=import-outside-toplevel
  from clawjax.rl.learner import Learner  # pylint: disable=import-outside-toplevel
  return Learner(LearnerConfig(micro_batches=micro_batches, **cfg_kwargs), Decoder(model_cfg, rngs=nnx.Rngs(0)))


def _model_cfg(sizes: dict, small: bool, attention: str):
  from clawjax.models.config import preset  # pylint: disable=import-outside-toplevel
  runtime: dict[str, Any] = {"n_layers": sizes["layers"], "attention_impl": attention}
  if small:
    runtime.update(vocab_size=8192, attention_block=128)
  else:  # the paper's run-time settings (configs/paper/common.py)
    runtime.update(attention_block=512, dtype="bfloat16", param_dtype="float32", remat=True)
  return preset(sizes["preset"], **runtime)


def part_learner_mfu(small: bool) -> dict[str, Any]:
  import jax  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  kind = jax.devices()[0].device_kind
  peak = _peak(kind)
  model_cfg = _model_cfg(sizes, small, "blocked")
  out: dict[str, Any] = {"device_kind": kind, "peak_bf16_flops": peak, "preset": sizes["preset"],
                         "layers": model_cfg.n_layers, "rows": {}}
  learner_kwargs = {"lr": 1e-6, "logits_chunk": 128 if small else 512}
  for row_len in sizes["rows"]:
    tree, paths = _group(row_len, sizes["calls"], seed=row_len)
    row: dict[str, Any] = {}
    for name, batch, micro in (("tree", tree, 1), ("paths", paths, paths.shape[0])):
      timed = _timed_steps(_learner(learner_kwargs, model_cfg, micro), batch, sizes["repeats"])
      flops = _flops(model_cfg, batch)
      row[name] = {**timed, "rows": batch.shape[0], "tokens": int((batch.segment_ids_RT > 0).sum()),
                   "flops": flops, "flops_per_s": flops / timed["step_s"],
                   "mfu": flops / timed["step_s"] / peak if peak else None}
    row["tree_speedup"] = row["paths"]["step_s"] / row["tree"]["step_s"]
    out["rows"][str(row_len)] = row
  return out


def part_pallas(small: bool) -> dict[str, Any]:
  from clawjax.models.attention import KERNELS  # pylint: disable=import-outside-toplevel
  if "pallas" not in KERNELS:
    return {"status": "unavailable", "reason": f"no 'pallas' attention kernel registered ({sorted(KERNELS)})"}
  sizes = _sizes(small)
  tree, _ = _group(sizes["rows"][0], sizes["calls"], seed=1)
  out: dict[str, Any] = {"row_len": sizes["rows"][0]}
  for impl in ("blocked", "pallas"):
    model_cfg = _model_cfg(sizes, small, impl)
    out[impl] = _timed_steps(_learner({"lr": 1e-6, "logits_chunk": 128 if small else 512}, model_cfg, 1), tree,
                             sizes["repeats"])
  out["pallas_speedup"] = out["blocked"]["step_s"] / out["pallas"]["step_s"]
  out["loss_rel_diff"] = abs(out["pallas"]["loss"] - out["blocked"]["loss"]) / max(abs(out["blocked"]["loss"]), 1e-30)
  return out


# ---- engine_decode ----------------------------------------------------------------------------------

def part_engine_decode(small: bool) -> dict[str, Any]:
  sys.path.insert(0, str(ROOT / "benchmarks"))
  from engine_throughput import decode_throughput  # pylint: disable=import-outside-toplevel
  from clawjax.models.loading import load_model  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  overrides = {} if small else {"dtype": "bfloat16", "param_dtype": "bfloat16"}
  model = load_model(sizes["engine_model"], random_init=True, **overrides).model
  out: dict[str, Any] = {"model": sizes["engine_model"], **overrides}
  for concurrency in sizes["concurrency"]:
    r = decode_throughput(model, concurrency, sizes["new_tokens"], 32, seed=0)
    out[f"decode_tok_s_{concurrency}"] = r["tok_s"]
    out[f"decode_{concurrency}_detail"] = r
  return out


# ---- sglang -----------------------------------------------------------------------------------------

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


async def _exchange(backend, model, workdir: pathlib.Path, out: dict[str, Any]) -> None:
  """Against the served weights: our backend's log-probs, one push of moved weights (exported as the
  trainer's push exports them), its weight_version read back, the log-probs again. One event loop for
  all of it: the backend's HTTP session belongs to the loop that made it."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from clawjax.generation import SamplingParams  # pylint: disable=import-outside-toplevel
  from clawjax.models import hf_io  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends.base import PromptIds  # pylint: disable=import-outside-toplevel
  prompt = list(range(1000, 1064))
  params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
  try:
    out["logprobs_v0"] = _logprob_diff(model, prompt, await backend.generate(PromptIds(prompt), params))
    keys = iter(jax.random.split(jax.random.key(1), 10_000))
    nnx.update(model, jax.tree.map(lambda x: x + 0.01 * jax.random.normal(next(keys), x.shape, x.dtype),
                                   nnx.state(model, nnx.Param)))
    start = time.monotonic()
    second = hf_io.save(model, workdir / "sglang_v1", dtype=hf_io.push_dtype(model.cfg))
    out["push_export_s"] = time.monotonic() - start
    out["push_bytes"] = sum(p.stat().st_size for p in second.glob("*.safetensors"))
    start = time.monotonic()
    out["weight_version_read_back"] = await backend.update_weights_from_disk(str(second), 1)
    await backend.flush_cache()
    out["update_weights_from_disk_s"] = time.monotonic() - start
    after = await backend.generate(PromptIds(prompt), params)
    out["generation_policy_version"] = after.policy_version
    out["logprobs_v1"] = _logprob_diff(model, prompt, after)
    out["status"] = "ok" if out["weight_version_read_back"] == 1 == after.policy_version else "failed"
  finally:
    await backend.close()


def part_sglang(small: bool, sglang_python: str | None, workdir: pathlib.Path, budget_s: float) -> dict[str, Any]:
  if small:
    return {"status": "skipped", "reason": "--small: real SGLang needs its CUDA build and a GPU"}
  if not sglang_python or not pathlib.Path(sglang_python).exists():
    return {"status": "skipped", "reason": f"no SGLang interpreter ({sglang_python!r}): its install failed or ran out of time"}
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
           "# Written by `python scripts/device_check.py --relock-sglang`; installed by scripts/device_check.sh",
           "# with `pip install --require-hashes --no-deps`.", f"# resolved for: {tag}"]
  for item in sorted(items, key=lambda i: i["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    sha256 = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
    if sha256 is None:
      raise ValueError(f"pip reported no sha256 for {name}=={version}")
    lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha256}")
  SGLANG_LOCK.parent.mkdir(parents=True, exist_ok=True)
  SGLANG_LOCK.write_text("\n".join(lines) + "\n")
  return SGLANG_LOCK


# ---- driver -----------------------------------------------------------------------------------------

def _run_part(name: str, args: argparse.Namespace, budget_s: float) -> dict[str, Any]:
  """One part in a child process (a crash, an out-of-memory or a hang ends that part only)."""
  result_file = pathlib.Path(args.workdir) / f"{name}.json"
  cmd = [sys.executable, __file__, "--part", name, "--workdir", args.workdir, "--budget-s", str(budget_s)]
  cmd += ["--small"] * args.small + (["--sglang-python", args.sglang_python] if args.sglang_python else [])
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
  if args.small:  # the CPU backend, without probing for accelerator plugins
    env["JAX_PLATFORMS"] = "cpu"
  if name == "sglang":  # the SGLang server shares the GPU with this part's JAX
    env.update(XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_MEM_FRACTION="0.3")
  start = time.monotonic()
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s, env=env)
  except subprocess.TimeoutExpired as e:
    tail = (e.stderr or b"")[-1500:]
    return {"status": "timeout", "seconds": round(time.monotonic() - start, 1), "budget_s": budget_s,
            "stderr_tail": tail.decode(errors="replace") if isinstance(tail, bytes) else tail}
  seconds = round(time.monotonic() - start, 1)
  if proc.returncode != 0 or not result_file.exists():
    return {"status": "failed", "seconds": seconds, "returncode": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
  result = json.loads(result_file.read_text())
  status = result.pop("status", "ok")
  return {"status": status, "seconds": seconds, **({"reason": result.pop("reason")} if "reason" in result else {}),
          "result": result}


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--small", action="store_true", help="tiny sizes on the CPU, SGLang skipped (the CPU test)")
  p.add_argument("--out", help="the JSON report")
  p.add_argument("--workdir", default=None, help="exports, logs and part results (default: beside --out)")
  p.add_argument("--sglang-python", default=None, help="the interpreter of the SGLang CUDA venv")
  p.add_argument("--install-dir", default=None, help="device_check.sh's install steps, a NAME.json each; "
                 "the sglang part waits for sglang.json (its install runs meanwhile)")
  p.add_argument("--deadline-s", type=float, default=560.0, help="seconds for all parts together")
  p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
  p.add_argument("--relock-sglang", action="store_true", help=f"rewrite {SGLANG_LOCK.relative_to(ROOT)}")
  p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child process runs one part
  p.add_argument("--budget-s", type=float, default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.relock_sglang:
    print(relock_sglang())
    return 0
  if args.part:
    workdir = pathlib.Path(args.workdir)
    if args.part == "sglang":
      result = part_sglang(args.small, args.sglang_python, workdir, args.budget_s)
    else:
      result = {"learner_mfu": part_learner_mfu, "pallas": part_pallas,
                "engine_decode": part_engine_decode}[args.part](args.small)
    (workdir / f"{args.part}.json").write_text(json.dumps(result))
    return 0
  if not args.out:
    p.error("--out is required")
  out = pathlib.Path(args.out)
  args.workdir = args.workdir or str(out.parent / (out.stem + "_work"))
  pathlib.Path(args.workdir).mkdir(parents=True, exist_ok=True)
  started = time.monotonic()
  deadline = started + args.deadline_s
  install_dir = pathlib.Path(args.install_dir) if args.install_dir else None
  report: dict[str, Any] = {"small": args.small, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "parts": {}}
  for name in args.parts:
    if name == "sglang" and install_dir and not args.small:
      while not (install_dir / "sglang.json").exists() and time.monotonic() < deadline - 60:
        time.sleep(2)  # its install, in the background since the start
    budget = min(SMALL_BUDGET_S if args.small else BUDGET_S[name], deadline - time.monotonic())
    if budget < 20:
      report["parts"][name] = {"status": "skipped", "seconds": 0, "reason": "out of time"}
    else:
      report["parts"][name] = _run_part(name, args, budget)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {report['parts'][name]['status']} "
          f"({report['parts'][name]['seconds']} s)", file=sys.stderr, flush=True)
  report["install"] = {p.stem: json.loads(p.read_text()) for p in sorted(install_dir.glob("*.json"))} if install_dir else {}
  try:
    from clawjax.environment import describe  # pylint: disable=import-outside-toplevel
    report["environment"] = describe()
  except ImportError as e:  # the JAX venv's install failed: the report still says so
    report["environment"] = {"error": str(e)}
  report["wall_s"] = round(time.monotonic() - started, 1)
  out.write_text(json.dumps(report, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
