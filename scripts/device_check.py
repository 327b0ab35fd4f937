"""The accelerator check: clawjax's learner, MoE, kernels and engine on the machine's accelerator, beside a
PyTorch peer on the same shapes, each part in its own process under its own time limit.

  python scripts/device_check.py --out DIR [--small] [--parts NAME ...] [--deadline-s 505]

(scripts/device_check.sh runs it with the machine's own interpreter after installing the wheels carried
in `.whl/`.) It fits one 10-minute command on a lent machine: the parts' budgets add up to the default
deadline (505 s), which leaves a margin for installing the wheels, starting and packing. DIR gets two
files, both rewritten after each part: device_check.json, the report (the parts' status, seconds and
results, and the side-by-side ratios of `summary` as far as the parts so far give them), and
parts.tar.gz (each part's own JSON and its whole log). A part records its figures as they come in (a
learner step's compile seconds as soon as JAX reports them, its first step as soon as it ends), so a part
cut off by its time limit keeps what it measured. Parts, in order:

  environment   the devices, nvidia-smi, package versions (clawjax.environment, and torch, transformers
                and the jax CUDA plugin's).
  kernels       the tree-attention kernel that `attention_impl="pallas"` lowers to here, forward and
                gradients against dense attention in float32 (max relative errors on small shapes), the
                MoE's grouped-matmul kernel against float64 and `lax.ragged_dot`, then
                one layer's attention on the 8K tree row timed against "blocked"
                (benchmarks/tree_attention_kernels.py), at the GPU kernel's default tile and at 128.
  learner_8k    the learner's step (Qwen3-8B layer shapes x 4 layers, random init, bf16 compute over f32
                parameters, remat, Pallas attention) on one GRPO group of two agent rollouts: the tree
                layout in one 8K row, and its paths layout; seconds, tokens/s, MFU, peak memory.
  torch_8k      the PyTorch + transformers peer (benchmarks/torch_peer.py) on one 8K causal row.
  moe_8k        the learner's step on Qwen3-30B-A3B layer shapes x 2 layers, the tree row at 8K.
  learner_32k   the tree layout at 32K (the paths layout takes minutes there).
  torch_32k     the peer at 32K, or at the longest row the device's memory holds (the peer's f32 log-probs
                over 32,767 x 151,936 alone are 19.9 GB: `torch_peer.fitting_row_len`), or skipped
                with the reason.
  engine_decode the embedded engine's decode tokens/s (Qwen3-0.6B, bf16) at 1, 16 and 64 requests.
  profile_8k    one learner_8k tree step under the JAX profiler: device time by kernel, top entries and
                by kind (matmul, attention kernel, fusion, copy/convert, ...).
  cublas_8k     learner_8k's tree step with XLA's Triton GEMM emitter off (every matmul on cuBLAS).
  variants_8k   learner_8k's tree step with attention "blocked" and "dense", and without remat.

The parts that the targets rest on come first; a part gets its own limit or what is left of the deadline,
whichever is less, so on a slow machine the diagnostic ones at the end are what is skipped. MFU counts the
model FLOPs of a step as 3 x its forward (`clawjax.aot.flops.forward_flops`, for both sides; recomputation
not counted) against the chip's dense bf16 peak (`clawjax.aot.topology.CHIPS`). --small: tiny shapes on the
CPU (what tests/benchmarks/test_device_check.py runs).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# name -> seconds it may take on an H200, in the order the parts run: those the targets rest on first, the
# slowest-to-matter last (a part gets its own budget or what is left of the deadline, whichever is less;
# its process's start and first compile are in it).
BUDGET_S = {"environment": 15, "kernels": 45, "learner_8k": 60, "torch_8k": 30, "moe_8k": 50, "learner_32k": 50,
            "torch_32k": 30, "engine_decode": 60, "profile_8k": 35, "cublas_8k": 40, "variants_8k": 90}
PARTS = tuple(BUDGET_S)
COMMAND_S = 600                      # one command on a lent machine
DEADLINE_S = sum(BUDGET_S.values())  # every part its whole budget: 505 s
MARGIN_S = 60                        # the command's time outside the parts: wheels, Python, packing
# XLA flags of a part's own process (read once, when JAX starts): the 8K tree step with every GEMM on
# cuBLAS instead of XLA's choice between cuBLAS and its Triton emitter.
PART_XLA_FLAGS = {"cublas_8k": "--xla_gpu_enable_triton_gemm=false"}
SMALL_BUDGET_S = 400  # a part on a loaded 2-core CPU (its compiles are slow; 240 s was short under load 20)
MIN_PART_S = 15       # a part with less time left is recorded as skipped
ARCHIVE = "parts.tar.gz"
REPORT = "device_check.json"


class Recorder:
  """A part's figures, written whole to its JSON file at each `put`: a part cut off keeps what it has."""

  def __init__(self, path: pathlib.Path):
    self.path, self.data = path, {}

  def put(self, **items: Any) -> None:
    self.data.update(items)
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(self.data, indent=1))
    os.replace(tmp, self.path)


def _sizes(small: bool) -> dict[str, Any]:
  if small:
    return {"preset": "test-tiny", "layers": 1, "moe_preset": "test-tiny-moe", "moe_layers": 1, "rows": (512, 1024),
            "calls": 2, "engine_model": "test-tiny", "concurrency": (1, 4), "new_tokens": 8, "repeats": 1,
            "block": 64, "vocab": 8192}
  return {"preset": "qwen3-8b", "layers": 4, "moe_preset": "qwen3-30b-a3b", "moe_layers": 2, "rows": (8192, 32768),
          "calls": 8, "engine_model": "qwen3-0.6b", "concurrency": (1, 16, 64), "new_tokens": 64, "repeats": 2,
          "block": 512, "vocab": None}


def _model_cfg(small: bool, *, moe: bool = False, **runtime: Any):
  from clawjax.models.config import preset  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  settings: dict[str, Any] = {"n_layers": sizes["moe_layers" if moe else "layers"], "attention_impl": "pallas",
                              "attention_block": sizes["block"], "dtype": "bfloat16", "param_dtype": "float32",
                              "remat": True}
  if sizes["vocab"]:
    settings["vocab_size"] = sizes["vocab"]
  return preset(sizes["moe_preset" if moe else "preset"], **{**settings, **runtime})


# ---- the learner's steps --------------------------------------------------------------------------------

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


def _batch_flops(cfg, batch) -> tuple[int, float]:
  """(tokens, model FLOPs of a learner step on `batch`): every token through the layers, each one's
  ancestors-or-self attended, the vocabulary projection at the loss tokens; 3 x that forward."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from clawjax.aot.flops import forward_flops  # pylint: disable=import-outside-toplevel
  real = batch.segment_ids_RT > 0
  pairs = float(np.sum(np.where(real, batch.positions_RT + 1.0, 0.0)))
  forward = forward_flops(cfg, tokens=float(real.sum()), attended_pairs=pairs,
                          logit_tokens=float((batch.unique_weight_RT > 0).sum()))
  return int(real.sum()), 3 * sum(forward)


def _peak_flops() -> float | None:
  import jax  # pylint: disable=import-outside-toplevel
  from clawjax.aot.topology import chip_of  # pylint: disable=import-outside-toplevel
  chip = chip_of(jax.devices()[0].device_kind)
  return chip.peak_flops if chip else None


def _peak_memory_gib() -> float | None:
  """The device allocator's high-water mark so far (None where the backend keeps none, e.g. the CPU)."""
  import jax  # pylint: disable=import-outside-toplevel
  stats = jax.devices()[0].memory_stats() or {}
  return stats["peak_bytes_in_use"] / 2 ** 30 if "peak_bytes_in_use" in stats else None


def _learner(model_cfg, micro_batches: int, small: bool):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from clawjax.models.model import Decoder  # pylint: disable=import-outside-toplevel
  from clawjax.rl.config import LearnerConfig  # pylint: disable=import-outside-toplevel
  from clawjax.rl.learner import Learner  # pylint: disable=import-outside-toplevel
  cfg = LearnerConfig(micro_batches=micro_batches, lr=1e-6, logits_chunk=128 if small else 512)
  return Learner(cfg, Decoder(model_cfg, rngs=nnx.Rngs(0)))


class CompileClock:
  """The seconds JAX has spent compiling in this process, from its own monitoring events: tracing
  (`trace_s`), lowering to MLIR (`lower_s`) and XLA's compile (`xla_s`). `on_long_compile` runs after each
  program that took XLA `LONG_S` or more (a step's, not an eager op's), before that program runs."""

  LONG_S = 1.0

  EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace_s",
            "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
            "/jax/core/compile/backend_compile_duration": "xla_s"}

  def __init__(self):
    import jax  # pylint: disable=import-outside-toplevel
    self.seconds = dict.fromkeys(self.EVENTS.values(), 0.0)
    self.on_long_compile: Callable[[], None] = lambda: None
    jax.monitoring.register_event_duration_secs_listener(self._event)

  def _event(self, event: str, duration_s: float, **_: Any) -> None:
    if event in self.EVENTS:
      self.seconds[self.EVENTS[event]] += duration_s
      if self.EVENTS[event] == "xla_s" and duration_s >= self.LONG_S:
        self.on_long_compile()

  def since(self, start: dict[str, float]) -> dict[str, float]:
    return {k: round(v - start[k], 3) for k, v in self.seconds.items()}


_CLOCK: list[CompileClock] = []  # the process's one clock, made at its first timed step


def timed_step(model_cfg, batch, *, micro_batches: int, repeats: int, small: bool,
               record: Callable[[dict[str, Any]], None] = lambda figures: None) -> dict[str, Any]:
  """The learner's step (pi_old pass and update) on `batch`: the compile's seconds (`compile_s`) and the
  first (compiling) step's, the median of `repeats` more, tokens/s, model FLOPs, MFU and the allocator's
  peak. `record` gets the figures so far as each becomes known: a step cut off keeps what it had."""
  if not _CLOCK:
    _CLOCK.append(CompileClock())
  clock = _CLOCK[0]
  tokens, flops = _batch_flops(model_cfg, batch)
  peak = _peak_flops()
  figures: dict[str, Any] = {"rows": int(batch.shape[0]), "tokens": tokens, "flops": flops}
  learner = _learner(model_cfg, micro_batches, small)
  compile_start = dict(clock.seconds)  # the step's programs from here (the model's init is not the step)

  def compiled() -> None:
    figures["compile_s"] = clock.since(compile_start)
    record(figures)

  clock.on_long_compile = compiled
  try:
    start = time.perf_counter()
    first = learner.step(learner.prepare(batch))
    figures.update(first_step_s=round(time.perf_counter() - start, 3), loss=float(first["loss"]),
                   compile_s=clock.since(compile_start))
    record(figures)
    steps_s: list[float] = []
    for _ in range(repeats):
      steps_s.append(learner.step(learner.prepare(batch))["step_seconds"])
      step_s = statistics.median(steps_s)
      figures.update(steps_s=steps_s, step_s=step_s, tokens_per_s=tokens / step_s,
                     mfu=flops / step_s / peak if peak else None, peak_mem_gib=_peak_memory_gib())
      record(figures)
  finally:
    clock.on_long_compile = lambda: None
  return figures


def _timed_into(rec: Recorder, name: str, *args, **kwargs) -> None:
  """`timed_step`, its figures under `name` in the part's record as each comes in."""
  put = lambda figures: rec.put(**{name: dict(figures)})
  put(timed_step(*args, record=put, **kwargs))


def _learner_part(rec: Recorder, small: bool, row: int, layouts: tuple[str, ...], moe: bool = False) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  row_len = sizes["rows"][row]
  cfg = _model_cfg(small, moe=moe)
  rec.put(device_kind=jax.devices()[0].device_kind, preset=sizes["moe_preset" if moe else "preset"],
          layers=cfg.n_layers, row_len=row_len, attention_impl=cfg.attention_impl)
  tree, paths = _group(row_len, sizes["calls"], seed=row_len)
  for name in layouts:
    batch = {"tree": tree, "paths": paths}[name]
    _timed_into(rec, name, cfg, batch, micro_batches=batch.shape[0] if name == "paths" else 1,
                repeats=sizes["repeats"], small=small)


def part_learner_8k(rec: Recorder, small: bool) -> None:
  _learner_part(rec, small, 0, ("tree", "paths"))


def part_learner_32k(rec: Recorder, small: bool) -> None:
  _learner_part(rec, small, 1, ("tree",))


def part_moe_8k(rec: Recorder, small: bool) -> None:
  _learner_part(rec, small, 0, ("tree",), moe=True)


def part_cublas_8k(rec: Recorder, small: bool) -> None:
  rec.put(xla_flags=PART_XLA_FLAGS["cublas_8k"])
  _learner_part(rec, small, 0, ("tree",))


def part_variants_8k(rec: Recorder, small: bool) -> None:
  sizes = _sizes(small)
  tree, _ = _group(sizes["rows"][0], sizes["calls"], seed=sizes["rows"][0])
  for name, runtime in (("blocked", {"attention_impl": "blocked"}), ("dense", {"attention_impl": "dense"}),
                        ("no_remat", {"remat": False})):
    _timed_into(rec, name, _model_cfg(small, **runtime), tree, micro_batches=1, repeats=sizes["repeats"],
                small=small)


# ---- the PyTorch peer --------------------------------------------------------------------------------

def _torch_part(rec: Recorder, small: bool, row: int) -> None:
  """The peer on the row, or on the longest row the device's memory holds (`requested_row_len` says what
  was asked), or `skipped` with the reason when none of at least 1,024 tokens fits."""
  from torch_peer import device_memory_bytes, fitting_row_len, peer_step, step_bytes  # pylint: disable=import-outside-toplevel
  from clawjax.models.config import preset  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  runtime = {"n_layers": sizes["layers"], **({"vocab_size": sizes["vocab"]} if sizes["vocab"] else {})}
  cfg, requested = preset(sizes["preset"], **runtime), sizes["rows"][row]
  memory = device_memory_bytes()
  row_len = fitting_row_len(cfg, requested, memory)
  sizing = {"requested_row_len": requested, "device_memory_gib": round(memory / 2 ** 30, 1),
            "estimated_gib": round(step_bytes(cfg, requested) / 2 ** 30, 1)}
  if not row_len:
    rec.put(skipped=f"the peer's step needs ~{sizing['estimated_gib']} GiB at {requested} tokens (benchmarks/"
                    f"torch_peer.py step_bytes), the device has {sizing['device_memory_gib']} GiB", **sizing)
    return
  rec.put(**sizing)
  rec.put(**peer_step(cfg, row_len, repeats=sizes["repeats"]))


def part_torch_8k(rec: Recorder, small: bool) -> None:
  _torch_part(rec, small, 0)


def part_torch_32k(rec: Recorder, small: bool) -> None:
  _torch_part(rec, small, 1)


# ---- kernels, engine, profile, environment -------------------------------------------------------------

def part_kernels(rec: Recorder, small: bool) -> None:
  from tree_attention_kernels import time_kernels  # pylint: disable=import-outside-toplevel
  from clawjax.kernels.grouped_matmul.check import device_errors  # pylint: disable=import-outside-toplevel
  from clawjax.kernels.tree_attention.check import attention_errors  # pylint: disable=import-outside-toplevel
  # The rows of a packed GRPO group of two agent rollouts; on the CPU the kernels run in the Pallas
  # interpreter: small shapes.
  check_row, _ = _group(512 if small else 1024, 2, seed=512 if small else 1024)
  rec.put(attention=attention_errors(check_row.segment_ids_RT, check_row.subtree_end_RT,
                                     **({"block": 64, "n_heads": 4, "head_dim": 64} if small else {})))
  rec.put(moe=device_errors())
  sizes = _sizes(small)
  tree, _ = _group(sizes["rows"][0], sizes["calls"], seed=sizes["rows"][0])
  shape = ({"heads": 4, "kv_heads": 2, "head_dim": 64} if small else {"heads": 32, "kv_heads": 8, "head_dim": 128})
  # One layer's attention on learner_8k's tree row, forward and backward: the GPU kernel at its default
  # tile and at 128, against blocked.
  for gpu_block, impls in ((64, ("pallas", "blocked")), (128, ("pallas",))):
    rec.put(**{f"attention_8k_tile{gpu_block}": time_kernels(tree.segment_ids_RT, tree.subtree_end_RT, **shape,
                                                             block=sizes["block"], impls=impls, repeats=sizes["repeats"],
                                                             gpu_block=gpu_block)})


def part_engine_decode(rec: Recorder, small: bool) -> None:
  from engine_throughput import decode_throughput  # pylint: disable=import-outside-toplevel
  from clawjax.models.loading import load_model  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  model = load_model(sizes["engine_model"], random_init=True, dtype="bfloat16", param_dtype="bfloat16").model
  rec.put(model=sizes["engine_model"], dtype="bfloat16", new_tokens=sizes["new_tokens"])
  for concurrency in sizes["concurrency"]:
    rec.put(**{f"decode_{concurrency}": decode_throughput(model, concurrency, sizes["new_tokens"], 32, seed=0)})


def part_profile_8k(rec: Recorder, small: bool) -> None:
  from step_profile import profile_step  # pylint: disable=import-outside-toplevel
  sizes = _sizes(small)
  tree, _ = _group(sizes["rows"][0], sizes["calls"], seed=sizes["rows"][0])
  learner = _learner(_model_cfg(small), 1, small)
  rec.put(**profile_step(lambda: learner.step(learner.prepare(tree))))


def part_environment(rec: Recorder, small: bool) -> None:
  from clawjax.environment import describe, versions  # pylint: disable=import-outside-toplevel
  del small
  query = "name,memory.total,driver_version,clocks.max.sm"
  try:
    smi = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                         text=True, timeout=20).stdout.strip()
  except (OSError, subprocess.TimeoutExpired) as e:
    smi = f"unavailable: {e}"
  rec.put(nvidia_smi=smi, **describe())
  rec.put(peer_packages=versions(PEER_PACKAGES))


# Versions beside clawjax.environment's: the peer's and the jax CUDA plugin of either CUDA major version (one
# is installed on a GPU image; the plugin and its PJRT are separate wheels).
PEER_PACKAGES = ("torch", "transformers", "jax-cuda12-plugin", "jax-cuda12-pjrt", "jax-cuda13-plugin",
                 "jax-cuda13-pjrt")


PART_FNS: dict[str, Callable[[Recorder, bool], None]] = {
    "environment": part_environment, "kernels": part_kernels, "learner_8k": part_learner_8k,
    "torch_8k": part_torch_8k, "moe_8k": part_moe_8k, "learner_32k": part_learner_32k, "torch_32k": part_torch_32k,
    "engine_decode": part_engine_decode, "profile_8k": part_profile_8k, "variants_8k": part_variants_8k,
    "cublas_8k": part_cublas_8k}


# ---- the side-by-side summary ------------------------------------------------------------------------

def summary(results: dict[str, dict]) -> dict[str, Any]:
  """The ratios the parts measured so far give: clawjax's tree step against the PyTorch peer per row length
  (tokens/s, and a GRPO group's time against the peer training its paths; only where the peer ran the
  learner's row length), MFUs, the MoE's memory. A part cut off gives what it recorded."""
  out: dict[str, Any] = {}
  for label in ("8k", "32k"):
    ours, peer = results.get(f"learner_{label}", {}), results.get(f"torch_{label}", {})
    tree = ours.get("tree", {})
    if "step_s" in tree:
      out[f"mfu_tree_{label}"] = tree["mfu"]
    if "step_s" in tree and peer.get("tokens_per_s") and peer.get("row_len") == ours.get("row_len"):
      out[f"tree_vs_torch_tokens_per_s_{label}"] = tree["tokens_per_s"] / peer["tokens_per_s"]
      out[f"mfu_torch_{label}"] = peer["mfu"]
      paths = ours.get("paths", {})
      if "tokens" in paths:  # the group's loss tokens trained by the peer on each path, against the tree step
        out[f"group_vs_torch_on_paths_{label}"] = paths["tokens"] / peer["tokens_per_s"] / tree["step_s"]
  moe = results.get("moe_8k", {}).get("tree", {})
  if "step_s" in moe:
    out.update(mfu_moe_8k=moe["mfu"], moe_8k_peak_mem_gib=moe["peak_mem_gib"])
  return out


# ---- driver --------------------------------------------------------------------------------------------

def _run_part(name: str, args: argparse.Namespace, budget_s: float) -> dict[str, Any]:
  """One part in a child process: a crash, an out-of-memory or a hang ends that part only, and what it
  recorded before survives. Its JSON and whole log go to `args.work`."""
  work = pathlib.Path(args.work)
  result_file = work / f"{name}.json"
  cmd = [sys.executable, __file__, "--part", name, "--out", str(work)] + ["--small"] * args.small
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
             JAX_COMPILATION_CACHE_DIR=args.cache_dir)  # the profile part reuses learner_8k's programs
  if args.small:
    env["JAX_PLATFORMS"] = "cpu"
  if name in PART_XLA_FLAGS:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {PART_XLA_FLAGS[name]}".strip()
  log = work / f"{name}.log"
  start = time.monotonic()
  with log.open("w") as out:
    try:
      returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=budget_s, env=env).returncode
      status = "ok" if returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
      status = "timeout"
  record: dict[str, Any] = {"status": status, "seconds": round(time.monotonic() - start, 1), "budget_s": round(budget_s)}
  if status != "ok":
    record["log_tail"] = log.read_text(errors="replace")[-1500:]
  if result_file.exists():
    record["result"] = json.loads(result_file.read_text())
    if status == "ok" and "skipped" in record["result"]:
      record.update(status="skipped", reason=record["result"]["skipped"])
  return record


def _write(out_dir: pathlib.Path, report: dict[str, Any], work: pathlib.Path) -> None:
  """The report and the archive of the parts' files, each replaced whole (a command cut off while writing
  leaves the previous ones)."""
  tmp = out_dir / f".{ARCHIVE}.tmp"
  with tarfile.open(tmp, "w:gz") as archive:
    for path in sorted(work.iterdir()):
      if path.suffix in (".json", ".log"):
        archive.add(path, arcname=f"parts/{path.name}")
  os.replace(tmp, out_dir / ARCHIVE)
  tmp = out_dir / f".{REPORT}.tmp"
  tmp.write_text(json.dumps(report, indent=1) + "\n")
  os.replace(tmp, out_dir / REPORT)


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help=f"folder of the report ({REPORT}) and the parts' archive ({ARCHIVE})")
  p.add_argument("--small", action="store_true", help="tiny shapes on the CPU (the CPU test)")
  p.add_argument("--deadline-s", type=float, default=DEADLINE_S,
                 help=f"seconds for all parts together (default: their budgets' sum, {DEADLINE_S}; the "
                      f"command needs about {MARGIN_S} s more)")
  p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
  p.add_argument("--cache-dir", default=None, help="the parts' shared JAX compilation cache (default: a temporary folder)")
  p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child process runs one part
  args = p.parse_args(argv)
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  if args.part:
    PART_FNS[args.part](Recorder(out_dir / f"{args.part}.json"), args.small)
    return 0
  started = time.monotonic()
  with tempfile.TemporaryDirectory(prefix="clawjax-device-check-") as tmp:
    args.cache_dir = args.cache_dir or os.path.join(tmp, "cache")
    args.work = os.path.join(tmp, "parts")
    os.makedirs(args.work)
    report: dict[str, Any] = {"small": args.small, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "deadline_s": args.deadline_s, "archive": ARCHIVE, "parts": {}}
    for name in args.parts:
      left = args.deadline_s - (time.monotonic() - started)
      budget = min(SMALL_BUDGET_S if args.small else BUDGET_S[name], left)
      if budget < MIN_PART_S:
        report["parts"][name] = {"status": "skipped", "seconds": 0, "reason": "out of time"}
      else:
        report["parts"][name] = _run_part(name, args, budget)
      print(f"[{time.strftime('%H:%M:%S')}] {name}: {report['parts'][name]['status']} "
            f"({report['parts'][name]['seconds']} s)", file=sys.stderr, flush=True)
      results = {k: v["result"] for k, v in report["parts"].items() if "result" in v}
      report.update(summary=summary(results), wall_s=round(time.monotonic() - started, 1))
      _write(out_dir, report, pathlib.Path(args.work))
  return 0


if __name__ == "__main__":
  sys.exit(main())
