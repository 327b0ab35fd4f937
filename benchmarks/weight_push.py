"""The weight push: what the exporter writes per second for a remote engine, how much of it changes, and
the move into an embedded engine on devices of its own.

  python benchmarks/weight_push.py [--json] [--parts export changes device_move] [--steps 3]

export: `hf_io.save` (the push's exporter) of a random-init model shaped like Qwen3-30B-A3B's layers
  (`--export-layers` of them, `--export-experts` experts, a `--export-vocab` vocabulary: as large as a
  shared 24 GiB machine allows), bf16 compute over f32 master weights as configs/paper has it. Timed
  twice: the f32 files every push wrote before `hf_io.push_dtype`, and the bf16 ones it writes now.
  save_s: to the page cache; fsync_s: then on disk; read_s: every tensor read back (page cache, so the
  engine side's best case). Each figure is bytes / seconds on one process.
changes: a few real learner updates (GRPO loss, the config's learner settings and learning rate) of the
  quickstart's toy model and of SmolLM2-135M-Instruct (configs/smollm2/grpo.py, whose GRPO starts from
  its cold start: here the pretrained weights), and of SmolLM2 at the paper's lr 1e-6, on agent-shaped
  synthetic GRPO groups (clawjax.tree.synthetic) packed as the configs pack them, a new group each step.
  After each update the policy's bf16 values are compared with the previous step's: the fraction of
  values that changed, of tensors with any change, and of the bytes in those tensors (what a push of
  only the changed tensors would send). Both models tie the embedding to the output projection, so every
  vocabulary row gets a gradient whatever tokens the data holds.
device_move: the route without a disk (EngineConfig.devices): the export part's model, its f32 weights
  sharded over `--learner-devices` devices (fsdp) as a learner holds them, moved into an engine's
  shardings on the next `--engine-devices` devices (tensor parallel) by `KVRunner.weights` (cast to the
  compute dtype, `jax.device_put`, ready): on CPU devices of this host (simulated: the process re-runs
  itself with XLA's host device count when it has too few). bytes: what the engine holds; per engine
  device: the most any one of them receives.
extrapolation_30b: the seconds these imply for Qwen3-30B-A3B (30.5e9 parameters) at this machine's
  bytes/s: an extrapolation, not a measurement; for the device move, the bytes per engine device over
  NVLink 4 and TPU v5p ICI at their vendors' figures (LINKS).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open

from clawjax import sharding
from clawjax.engine.engine import EngineConfig
from clawjax.engine.kv_forward import KVRunner
from clawjax.engine.placement import engine_devices, learner_devices
from clawjax.environment import describe as describe_environment
from clawjax.models import hf_io
from clawjax.models.loading import load_model
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees

ROOT = pathlib.Path(__file__).resolve().parents[1]
QWEN3_30B_A3B_PARAMS = 30.5e9   # Qwen3-30B-A3B's total parameters (its model card)
PAPER_LR = 1e-6                 # configs/paper/common.py
# Bytes/s into one device, one direction: the links a device-to-device weight move runs over.
LINKS = {
    # nvidia.com/en-us/data-center/h200 and h100 (SXM): NVLink 900 GB/s bidirectional per GPU; the
    # p2pBandwidthLatencyTest reaches 376-380 GB/s one way on H100 SXM (github.com/NVIDIA/nccl/issues/1264).
    "nvlink4_h100_h200": 450e9,
    # cloud.google.com/tpu/docs/v5p: 1,200 GB/s bidirectional ICI per chip (4,800 Gbps), over the 3D
    # torus' six links; half of it arriving at a chip.
    "ici_tpu_v5p": 600e9,
}


def _progress(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _dir_bytes(path: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def _timed_export(model, out: pathlib.Path, dtype: str | None) -> dict[str, Any]:
  start = time.perf_counter()
  hf_io.save(model, out, dtype=dtype)
  saved = time.perf_counter()
  for path in out.glob("*.safetensors"):
    with open(path, "rb+") as f:
      os.fsync(f.fileno())
  synced = time.perf_counter()
  tensors = 0
  for path in out.glob("*.safetensors"):
    with safe_open(path, "np") as f:
      for key in f.keys():
        f.get_tensor(key)
        tensors += 1
  read = time.perf_counter()
  nbytes = _dir_bytes(out)
  save_s, fsync_s, read_s = saved - start, synced - saved, read - synced
  return {"dtype": dtype or "float32", "bytes": nbytes, "tensors": tensors, "save_s": round(save_s, 3),
          "fsync_s": round(fsync_s, 3), "read_s": round(read_s, 3),
          "save_bytes_per_s": round(nbytes / save_s), "save_fsync_bytes_per_s": round(nbytes / (save_s + fsync_s)),
          "read_bytes_per_s": round(nbytes / read_s)}


def _export_model(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
  """The model of the export and device_move parts, and what describes it (its sizes, its parameters)."""
  overrides = dict(n_layers=args.export_layers, n_experts=args.export_experts, vocab_size=args.export_vocab,
                   top_k=min(8, args.export_experts),
                   dtype="bfloat16", param_dtype="float32")
  model = load_model(args.export_preset, random_init=True, **overrides).model
  params = sum(v[...].size for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  return model, {"preset": args.export_preset, **overrides, "params": int(params)}


def measure_export(args: argparse.Namespace, workdir: pathlib.Path) -> dict[str, Any]:
  model, described = _export_model(args)
  out: dict[str, Any] = {**described,
                         "push_dtype": hf_io.push_dtype(model.cfg)}
  for label, dtype in (("f32", None), ("bf16", hf_io.push_dtype(model.cfg))):
    runs = []
    for i in range(args.repeats):
      target = workdir / f"export_{label}_{i}"
      runs.append(_timed_export(model, target, dtype))
      shutil.rmtree(target)
      _progress(f"export {label}: {runs[-1]}")
    out[label] = min(runs, key=lambda r: r["save_s"] + r["fsync_s"])
  return out


def measure_device_move(args: argparse.Namespace) -> dict[str, Any]:
  """The learner's sharded weights into an engine on other devices of this process (see the docstring)."""
  needed = args.learner_devices + args.engine_devices
  if jax.device_count() < needed:  # XLA's host device count is fixed when JAX starts: re-run with it
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={needed}")
    cmd = [sys.executable, __file__, "--json", "--parts", "device_move", *_forwarded(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout)["device_move"]
  model, described = _export_model(args)
  state = nnx.state(model)
  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=args.learner_devices),
                            learner_devices(args.engine_devices)[:args.learner_devices])
  learner_state = jax.block_until_ready(jax.device_put(state, sharding.state_shardings(state, mesh)))
  # The route as an accelerator engine runs it: without CPU's one-row copy (weight_layout.py), which would
  # add its own bytes and a transpose to what a device-to-device move costs.
  runner = KVRunner(model, EngineConfig(devices=args.engine_devices, one_row_copy="off"),
                    engine_devices(args.engine_devices))
  runs = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    weights = runner.weights(learner_state)
    runs.append(time.perf_counter() - start)
    _progress(f"device move: {runs[-1]:.3f} s")
  nbytes = runner.weight_bytes(weights)
  per_device = {d: 0 for d in runner.devices}
  for w in jax.tree.leaves(weights):
    for shard in w.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
  best = min(runs)
  return {**described, "learner_devices": args.learner_devices,
          "engine_devices": args.engine_devices, "platform": runner.devices[0].platform,
          "learner_bytes": sum(x.nbytes for x in jax.tree.leaves(learner_state)), "bytes": nbytes,
          "dtype": str(runner.weight_dtype), "bytes_per_engine_device": max(per_device.values()),
          "seconds": [round(r, 3) for r in runs], "bytes_per_s": round(nbytes / best)}


def _forwarded(args: argparse.Namespace) -> list[str]:
  """The options of the device_move part, for a re-run of this script."""
  return ["--export-preset", args.export_preset, "--export-layers", str(args.export_layers), "--export-experts",
          str(args.export_experts), "--export-vocab", str(args.export_vocab), "--repeats", str(args.repeats),
          "--learner-devices", str(args.learner_devices), "--engine-devices", str(args.engine_devices)]


def _config(path: str):
  spec = importlib.util.spec_from_file_location("bench_config", ROOT / path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _model_and_learner(name: str, lr: float | None, args: argparse.Namespace) -> tuple[Any, Learner, dict]:
  """The model of a config (the quickstart's toy, or SmolLM2's pretrained weights) and its learner."""
  if name == "quickstart":
    c = _config("configs/quickstart.py")
    model = load_model(c.model.init, seed=c.seed, random_init=True, **c.model.overrides).model
  else:
    c = _config("configs/smollm2/grpo.py")
    model = load_model("smollm2-135m", **c.model.overrides).model
  lr = c.learner.lr if lr is None else lr
  rows = args.rows
  cfg = LearnerConfig(lr=lr, temperature=c.learner.temperature, logits_chunk=c.learner.logits_chunk,
                      micro_batches=min(c.learner.get("micro_batches", 1), rows))
  info = {"config": name, "lr": lr, "row_len": c.batch.row_len, "rows": rows,
          "rows_in_config": c.batch.rows, "micro_batches": cfg.micro_batches}
  return model, Learner(cfg, model), info


def _batch(rng: np.random.Generator, rows: int, row_len: int, vocab: int):
  """One GRPO group a row: the mini harness's shape (a ~400-token prompt, two calls)."""
  calls, outcomes = synthetic.agent_group(rng, task_id="bench", n_rollouts=rows, prompt_len=400, n_calls=2,
                                          tokens_per_call=60, vocab_size=vocab)
  by_rollout: dict[str, list] = {}
  for call in calls:
    by_rollout.setdefault(call.rollout_id, []).append(call)
  trees = [filter_rollout(rid, cs).tree for rid, cs in by_rollout.items()]
  return pack_trees(trees, grpo_advantages(outcomes), row_len=row_len)


def _bf16_params(learner: Learner) -> dict[str, np.ndarray]:
  """The policy's params rounded to bf16, on the host (the learner donates its arrays at each step)."""
  state = nnx.state(learner.policy_model(), nnx.Param)
  return {"/".join(map(str, path)): np.asarray(jax.device_get(v[...].astype(jnp.bfloat16)))
          for path, v in nnx.to_flat_state(state)}


def _changes(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> dict[str, Any]:
  values = changed_values = tensors_changed = bytes_all = bytes_changed = 0
  for name, old in before.items():
    # Bit patterns, so that a NaN or -0.0 counts as what it is.
    n = int(np.count_nonzero(old.view(np.uint16) != after[name].view(np.uint16)))
    values += old.size
    changed_values += n
    bytes_all += old.nbytes
    if n:
      tensors_changed += 1
      bytes_changed += old.nbytes
  return {"values_changed_fraction": changed_values / values, "tensors_changed_fraction": tensors_changed / len(before),
          "tensors": len(before), "bytes_in_changed_tensors_fraction": bytes_changed / bytes_all, "bf16_bytes": bytes_all}


def measure_changes(name: str, lr: float | None, args: argparse.Namespace) -> dict[str, Any]:
  model, learner, info = _model_and_learner(name, lr, args)
  vocab = model.cfg.vocab_size
  rng = np.random.default_rng(args.seed)
  before = _bf16_params(learner)
  steps = []
  for step in range(1, args.steps + 1):
    batch = _batch(rng, args.rows, info["row_len"], vocab)
    metrics = learner.step(learner.prepare(batch))
    after = _bf16_params(learner)
    steps.append({"step": step, **_changes(before, after), "step_s": round(metrics["step_seconds"], 2),
                  "loss_tokens": int((batch.unique_weight_RT > 0).sum())})
    _progress(f"changes {name} lr {info['lr']}: {steps[-1]}")
    before = after
  later = steps[1:] or steps  # Adam's first update moves every value by lr exactly; the later ones are typical
  summary = {k: statistics.median(s[k] for s in later)
             for k in ("values_changed_fraction", "tensors_changed_fraction", "bytes_in_changed_tensors_fraction")}
  return {**info, "params": sum(a.size for a in before.values()), "steps": steps, "median_after_step_1": summary}


def extrapolate(export: dict[str, Any] | None, changes: list[dict[str, Any]],
                move: dict[str, Any] | None = None) -> dict[str, Any]:
  """Seconds a Qwen3-30B-A3B push would take at this machine's measured bytes/s (an extrapolation)."""
  out: dict[str, Any] = {"extrapolation": True, "params": QWEN3_30B_A3B_PARAMS,
                         "f32_bytes": QWEN3_30B_A3B_PARAMS * 4, "bf16_bytes": QWEN3_30B_A3B_PARAMS * 2}
  if move:
    # As measured: the engine holds `bytes` (compute dtype), its busiest device receives that fraction.
    per_param = move["bytes"] / move["params"]
    share = move["bytes_per_engine_device"] / move["bytes"]
    per_device = QWEN3_30B_A3B_PARAMS * per_param * share
    out["device_move"] = {"engine_bytes": round(QWEN3_30B_A3B_PARAMS * per_param),
                          "engine_devices": move["engine_devices"], "bytes_per_engine_device": round(per_device),
                          "this_machine_s": round(QWEN3_30B_A3B_PARAMS * per_param / move["bytes_per_s"], 1),
                          **{f"{link}_s": round(per_device / rate, 3) for link, rate in LINKS.items()}}
  if export:
    for label, bytes_key in (("f32", "f32_bytes"), ("bf16", "bf16_bytes")):
      rates = export[label]
      out[f"{label}_save_s"] = round(out[bytes_key] / rates["save_bytes_per_s"], 1)
      out[f"{label}_save_fsync_s"] = round(out[bytes_key] / rates["save_fsync_bytes_per_s"], 1)
      out[f"{label}_read_s"] = round(out[bytes_key] / rates["read_bytes_per_s"], 1)
  for c in changes:
    key = f"{c['config']}_lr{c['lr']:g}_changed_values_bf16_bytes"
    out[key] = round(out["bf16_bytes"] * c["median_after_step_1"]["values_changed_fraction"])
  return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--parts", nargs="+", choices=("export", "changes", "device_move"),
                 default=["export", "changes", "device_move"])
  p.add_argument("--export-preset", default="qwen3-30b-a3b")
  p.add_argument("--export-layers", type=int, default=2)
  p.add_argument("--export-experts", type=int, default=16, help="of the preset's 128 (memory)")
  p.add_argument("--export-vocab", type=int, default=32768, help="the preset's 151936 (memory)")
  p.add_argument("--repeats", type=int, default=2, help="exports per dtype, device moves; the fastest counts")
  p.add_argument("--learner-devices", type=int, default=4, help="device_move: the learner's devices (fsdp)")
  p.add_argument("--engine-devices", type=int, default=4, help="device_move: the engine's (tensor parallel)")
  p.add_argument("--changes", nargs="+", default=["quickstart", "smollm2", "smollm2@paper_lr"],
                 help="configs for the changed-bytes part; NAME@paper_lr: at the paper's lr 1e-6")
  p.add_argument("--steps", type=int, default=3, help="learner updates per config")
  p.add_argument("--rows", type=int, default=2, help="rows (GRPO groups of one rollout tree each) per update")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--workdir", default=None, help="where the exports are written (default: a temp dir)")
  args = p.parse_args(argv)
  result: dict[str, Any] = {}
  with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
    if "export" in args.parts:
      result["export"] = measure_export(args, pathlib.Path(tmp))
  changes = []
  if "changes" in args.parts:
    for spec in args.changes:
      name, _, lr = spec.partition("@")
      changes.append(measure_changes(name, PAPER_LR if lr == "paper_lr" else None, args))
    result["changes"] = changes
  if "device_move" in args.parts:
    result["device_move"] = measure_device_move(args)
  result["extrapolation_30b"] = extrapolate(result.get("export"), changes, result.get("device_move"))
  result["environment"] = describe_environment()
  if args.json:
    print(json.dumps(result))
  else:
    print(json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  main()
