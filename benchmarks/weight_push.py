"""The weight push to a remote engine: what the exporter writes per second, and how much of it changes.

  python benchmarks/weight_push.py [--json] [--parts export changes] [--steps 3]

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
extrapolation_30b: the seconds these imply for Qwen3-30B-A3B (30.5e9 parameters) at this machine's
  bytes/s: an extrapolation, not a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open

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


def measure_export(args: argparse.Namespace, workdir: pathlib.Path) -> dict[str, Any]:
  overrides = dict(n_layers=args.export_layers, n_experts=args.export_experts, vocab_size=args.export_vocab,
                   top_k=min(8, args.export_experts),
                   dtype="bfloat16", param_dtype="float32")
  model = load_model(args.export_preset, random_init=True, **overrides).model
  params = sum(v[...].size for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  out: dict[str, Any] = {"preset": args.export_preset, **overrides, "params": int(params),
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


def extrapolate(export: dict[str, Any] | None, changes: list[dict[str, Any]]) -> dict[str, Any]:
  """Seconds a Qwen3-30B-A3B push would take at this machine's measured bytes/s (an extrapolation)."""
  out: dict[str, Any] = {"extrapolation": True, "params": QWEN3_30B_A3B_PARAMS,
                         "f32_bytes": QWEN3_30B_A3B_PARAMS * 4, "bf16_bytes": QWEN3_30B_A3B_PARAMS * 2}
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
  p.add_argument("--parts", nargs="+", choices=("export", "changes"), default=["export", "changes"])
  p.add_argument("--export-preset", default="qwen3-30b-a3b")
  p.add_argument("--export-layers", type=int, default=2)
  p.add_argument("--export-experts", type=int, default=16, help="of the preset's 128 (memory)")
  p.add_argument("--export-vocab", type=int, default=32768, help="the preset's 151936 (memory)")
  p.add_argument("--repeats", type=int, default=2, help="exports per dtype; the fastest counts")
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
  result["extrapolation_30b"] = extrapolate(result.get("export"), changes)
  result["environment"] = describe_environment()
  if args.json:
    print(json.dumps(result))
  else:
    print(json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  main()
