"""Tree attention kernels on paper-shaped rows: the blocks the Pallas kernel skips, and the "pallas" vs
"blocked" kernels compiled for a TPU target (compile only: figures from XLA's analyses, no run).

Data: GRPO groups of `clawjax.tree.synthetic.agent_group` (a long shared task prompt, tool loops whose
inputs repeat ~99% of the previous call, with subagents, compactions, retries, parallel tool calls and
stripped thinking), filtered to trees and packed (prompts shared) into rows of `--row-len` tokens.

Skip figures per block size, over all rows: `visible_blocks` (the kernel's table: query block x key
block pairs it computes), `skipped_of_all` (1 - visible / nq^2 per row) and `skipped_of_causal` (of the
pairs a causal flash kernel would compute over the rows' real tokens: both blocks hold real tokens, key
block <= query block), and `attended_over_computed` (mask pairs / computed pairs: how full the computed
blocks are).

Compile figures (`--compile`): one attention layer's forward + backward (the gradients of q, k, v) on one
row, bf16, per-device heads (`--heads`, `--kv-heads`, `--head-dim`), for one chip of `--topology` (a TPU
slice, or a GPU node such as h200:1x1x1, where the Pallas kernel is the Triton one at its GPU tile):
XLA's memory analysis (argument / output / scratch bytes) and cost analysis (FLOPs, bytes accessed; none
on GPU) of each compiled program, and the lowering each kernel got. Cost analysis does not see inside a
Pallas kernel, so the kernel's FLOPs are counted analytically (`pallas_attention_flops`) from the first
row's visible blocks, and its block traffic to HBM by hand (`kernel_hbm_bytes`); nor does it multiply a
loop body by its trip count, so the blocked kernel's FLOPs are counted by hand as well (`analytic_flops`,
from its own skip rule).

Timed figures (`--time`, on JAX's default device: a GPU or TPU; on a CPU the Pallas kernel is the
interpreter): `time_kernels`, the forward + backward of each kernel on the first `--time-rows` rows.

  python benchmarks/tree_attention_kernels.py --json [--row-len 65536] [--blocks 128 256 512] [--compile]
  python benchmarks/tree_attention_kernels.py --json --compile --topology h200:1x1x1 --heads 32 --kv-heads 8
  python benchmarks/tree_attention_kernels.py --json --row-len 8192 --time --heads 32 --kv-heads 8  # on a GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # libtpu's machine-wide lock: not needed to compile

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.aot import lowering, topology
from clawjax.environment import describe as describe_environment
from clawjax.kernels.tree_attention import KERNELS
from clawjax.kernels.tree_attention.block_sparse import block_table, pallas_attention_flops
from clawjax.kernels.tree_attention.check import rel_error
from clawjax.kernels.tree_attention.dispatch import kernel_block, platform_of
from clawjax.kernels.tree_attention.reference import block_needed
from clawjax.kernels.tree_attention.triton_gpu import GPU_BLOCK
from clawjax.rl.advantages import grpo_advantages
from clawjax.tree import synthetic
from clawjax.tree.filters import filter_rollout
from clawjax.tree.pack import pack_trees

PATTERNS = ("thinking_stripped", "retry", "compaction", "subagent", "auxiliary", "parallel_tools")


def paper_rows(args) -> tuple[np.ndarray, np.ndarray, dict]:
  """(segment ids, subtree ends) [R, T] of packed groups, and what was packed."""
  rng = np.random.default_rng(args.seed)
  trees, outcomes = [], []
  for g in range(args.groups):
    calls, group_outcomes = synthetic.agent_group(
        rng, task_id=f"task-{g}", n_rollouts=args.rollouts, prompt_len=args.prompt_len, n_calls=args.calls,
        tokens_per_call=args.tokens_per_call, patterns=PATTERNS)
    by_rollout: dict[str, list] = {}
    for c in calls:
      by_rollout.setdefault(c.rollout_id, []).append(c)
    trees += [filter_rollout(rid, cs).tree for rid, cs in by_rollout.items()]
    outcomes += group_outcomes
  batch = pack_trees(trees, grpo_advantages(outcomes), row_len=args.row_len, share_prompts=True)
  if not batch.segment_ids_RT.shape[0]:
    raise SystemExit(f"no tree fits a row of {args.row_len} tokens (largest: {max(t.size for t in trees)})")
  real = batch.segment_ids_RT > 0
  info = {"groups": args.groups, "rollouts": len(trees), "rows": int(batch.segment_ids_RT.shape[0]),
          "row_len": args.row_len, "real_tokens": int(real.sum()), "fill": round(float(real.mean()), 3)}
  return batch.segment_ids_RT, batch.subtree_end_RT, info


def skip_figures(seg_RT: np.ndarray, end_RT: np.ndarray, block: int) -> dict:
  rows, t = seg_RT.shape
  nb = t // block
  table = np.asarray(block_table(jnp.asarray(seg_RT), jnp.asarray(end_RT), block))
  real_Rn = (seg_RT > 0).reshape(rows, nb, block).any(axis=2)
  causal = np.tril(np.ones((nb, nb), bool))[None] & real_Rn[:, :, None] & real_Rn[:, None, :]
  # Mask pairs: each real token attends to its ancestors-or-self, which in a packed row are the keys j
  # of its segment with j <= i < subtree_end[j]; counted per key as the length of its subtree.
  attended = float(np.sum(np.where(seg_RT > 0, end_RT - np.arange(t)[None], 0)))
  visible = int(table.sum())
  return {"block": block, "blocks_per_row": nb * nb, "visible_blocks": visible,
          "visible_blocks_per_row": [int(x) for x in table.sum(axis=(1, 2))],
          "causal_blocks": int(causal.sum()), "skipped_of_all": round(1 - visible / (rows * nb * nb), 4),
          "skipped_of_causal": round(1 - visible / int(causal.sum()), 4),
          "attended_over_computed": round(attended / (visible * block * block), 4)}


def _kernel(impl: str, block: int, gpu_block: int):
  if impl == "pallas":
    return functools.partial(KERNELS[impl], block=block, gpu_block=gpu_block)
  return functools.partial(KERNELS[impl], block=block)


def _visible_blocks(seg_RT, end_RT, block: int) -> int:
  """Visible (query block, key block) pairs over the rows, T padded to the block as the kernels pad it."""
  pad = ((0, 0), (0, -seg_RT.shape[1] % block))
  return int(np.asarray(block_table(jnp.pad(jnp.asarray(seg_RT), pad), jnp.pad(jnp.asarray(end_RT), pad), block)).sum())


def compile_figures(seg_T: np.ndarray, end_T: np.ndarray, block: int, args) -> dict:
  device = topology.devices(topology.parse(args.topology))[0]
  t, n, kv, h = seg_T.shape[0], args.heads, args.kv_heads, args.head_dim
  one = jax.sharding.SingleDeviceSharding(device)
  specs = (jax.ShapeDtypeStruct((1, t, n, h), jnp.bfloat16, sharding=one),
           *[jax.ShapeDtypeStruct((1, t, kv, h), jnp.bfloat16, sharding=one)] * 2,
           *[jax.ShapeDtypeStruct((1, t), jnp.int32, sharding=one)] * 2)
  kblock = kernel_block(block, platform_of(device), args.gpu_block)
  visible = _visible_blocks(seg_T[None], end_T[None], kblock)
  out = {"device": device.device_kind, "T": t, "heads": n, "kv_heads": kv, "head_dim": h, "block": block,
         "pallas_block": kblock, "visible_blocks": visible}
  for impl in ("pallas", "blocked"):
    kernel = _kernel(impl, block, args.gpu_block)

    def loss(q, k, v, seg, end):
      return jnp.sum(kernel(q, k, v, seg, end).astype(jnp.float32))

    start = time.perf_counter()
    with topology.lowering_for(device):
      compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*specs).compile()
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}  # none on GPU
    text = compiled.as_text()
    out[impl] = {"compile_s": round(time.perf_counter() - start, 1),
                 "argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
                 "temp_bytes": mem.temp_size_in_bytes, "xla_flops": float(cost.get("flops", 0.0)),
                 "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
                 "attention_lowering": lowering.attention_lowering([text]),
                 "kernel_calls": sum(text.count(f'custom_call_target="{x}"') for x in lowering.KERNEL_TARGETS)}
  # XLA counts a loop body once, so "blocked" is counted by hand too: per block its skip rule keeps,
  # 2 forward matmuls, 2 + 2 recomputed (the query block's and the key step's remat) and 4 backward.
  out["blocked"]["needed_blocks"] = needed = blocked_needed_blocks(seg_T, end_T, block)
  out["blocked"]["analytic_flops"] = 10 * 2.0 * needed * block * block * h * n
  out["pallas"]["kernel_flops"] = pallas_attention_flops(visible, kblock, h, n)
  out["pallas"]["kernel_hbm_bytes"] = pallas_hbm_bytes(visible, -(-t // kblock), kblock, n, kv, h)
  return out


def time_kernels(seg_RT: np.ndarray, end_RT: np.ndarray, *, heads: int, kv_heads: int, head_dim: int,
                 block: int, impls: tuple[str, ...] = ("pallas", "blocked", "dense"), repeats: int = 5,
                 gpu_block: int = GPU_BLOCK, seed: int = 0) -> dict:
  """Forward + backward (the output and the gradients of q, k, v) of each attention kernel on JAX's
  default device: bf16 random q, k, v over the given rows' segment ids and subtree ends [R, T], compiled
  once, run once, then `repeats` timed runs (`step_s`: their median). Per kernel also the lowering it got
  (on a GPU, "triton" for pallas: the Triton kernel ran, not the interpreter) and, against "dense" (or
  "blocked" where dense did not run), max |a - b| / max |b| of the output and each gradient: the kernels
  checked on the device itself. For pallas: the block it tiled at, its visible blocks, its FLOPs
  (`pallas_attention_flops`) and the TFLOP/s they make. A kernel the device cannot run (dense runs out of
  memory on long rows) reports its error, and the others still run."""
  device = jax.devices()[0]
  r, t = seg_RT.shape
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (r, t, heads, head_dim), jnp.bfloat16)
  k, v = (jax.random.normal(key, (r, t, kv_heads, head_dim), jnp.bfloat16) for key in keys[1:3])
  cotangent = jax.random.normal(keys[3], q.shape, jnp.bfloat16)
  seg, end = jnp.asarray(seg_RT, jnp.int32), jnp.asarray(end_RT, jnp.int32)
  out = {"device": device.device_kind, "platform": device.platform, "rows": r, "T": t, "heads": heads,
         "kv_heads": kv_heads, "head_dim": head_dim, "block": block, "repeats": repeats}
  results = {}
  for impl in impls:
    kernel = _kernel(impl, block, gpu_block)

    def forward_and_backward(q, k, v):
      o, vjp = jax.vjp(lambda q, k, v: kernel(q, k, v, seg, end), q, k, v)
      return (o, *vjp(cotangent))

    try:
      start = time.perf_counter()
      compiled = jax.jit(forward_and_backward).lower(q, k, v).compile()
      compile_s = time.perf_counter() - start
      results[impl] = jax.block_until_ready(compiled(q, k, v))  # the first run also loads the program
      times = []
      for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(q, k, v))
        times.append(time.perf_counter() - start)
    except jax.errors.JaxRuntimeError as e:
      out[impl] = {"error": str(e).splitlines()[0][:300]}
      continue
    out[impl] = {"compile_s": round(compile_s, 2), "step_s": statistics.median(times),
                 "steps_s": [round(x, 6) for x in times],
                 "attention_lowering": lowering.attention_lowering([compiled.as_text()])}
  reference = next((impl for impl in ("dense", "blocked") if impl in results), None)
  for impl in results.keys() - {reference} if reference else ():  # nothing to compare against
    errors = [rel_error(a, b) for a, b in zip(results[impl], results[reference])]
    out[impl]["rel_err_vs"] = reference
    out[impl]["rel_err"] = dict(zip(("o", "dq", "dk", "dv"), errors))
  if "pallas" in results:
    kblock = kernel_block(block, platform_of(device), gpu_block)
    visible = _visible_blocks(seg_RT, end_RT, kblock)
    flops = pallas_attention_flops(visible, kblock, head_dim, heads)
    out["pallas"].update(kernel_block=kblock, visible_blocks=visible, kernel_flops=flops,
                         kernel_tflops_per_s=flops / out["pallas"]["step_s"] / 1e12)
  return out


def blocked_needed_blocks(seg_T: np.ndarray, end_T: np.ndarray, block: int) -> int:
  """Key blocks the "blocked" kernel computes (its `block_needed` rule), summed over query blocks."""
  nb = seg_T.shape[0] // block
  seg_n1B, end_n1B = (jnp.asarray(x.reshape(nb, 1, block)) for x in (seg_T, end_T))
  starts = jnp.arange(nb) * block
  one_q = lambda qs, q_seg: jax.vmap(lambda ks, k_seg, k_end: block_needed(
      qs, q_seg, ks, k_seg, k_end, block))(starts, seg_n1B, end_n1B)
  return int(jnp.sum(jax.jit(jax.vmap(one_q))(starts, seg_n1B)))


def pallas_hbm_bytes(visible: int, nb: int, block: int, n: int, kv: int, h: int, itemsize: int = 2) -> int:
  """The kernels' block traffic (bf16), forward + backward: a block index that does not change between
  grid steps is not fetched again, and a step holds a KV head's whole query-head group. Forward: q and o
  once per query block, k and v per visible block and KV head; dQ: q, dO, dQ once, k and v per visible
  block; dK/dV: k, v, dK, dV once, q and dO per visible block and query head. The per-query statistics
  and the row arrays are left out (< 1%)."""
  tile = block * h * itemsize
  forward = (2 * n * nb + 2 * kv * visible) * tile
  dq = (3 * n * nb + 2 * kv * visible) * tile
  dkv = (4 * kv * nb + 2 * n * visible) * tile
  return forward + dq + dkv


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--row-len", type=int, default=65536)
  p.add_argument("--groups", type=int, default=2, help="GRPO groups packed")
  p.add_argument("--rollouts", type=int, default=8, help="rollouts per group")
  p.add_argument("--prompt-len", type=int, default=4000, help="task prompt tokens")
  p.add_argument("--calls", type=int, default=40, help="main calls per rollout")
  p.add_argument("--tokens-per-call", type=int, default=200, help="history growth per call")
  p.add_argument("--blocks", type=int, nargs="+", default=[128, 256, 512])
  p.add_argument("--compile", action="store_true", help="also compile pallas and blocked for --topology")
  p.add_argument("--compile-block", type=int, default=512, help="the kernels' block (attention_block)")
  p.add_argument("--topology", default="v5e:2x2", help="a TPU slice or GPU node (clawjax/aot/topology.py)")
  p.add_argument("--gpu-block", type=int, default=GPU_BLOCK, help="the Pallas kernel's largest tile on a GPU")
  p.add_argument("--time", action="store_true", help="time the kernels on the default device")
  p.add_argument("--time-rows", type=int, default=1, help="rows timed (the first ones)")
  p.add_argument("--impls", nargs="+", default=["pallas", "blocked", "dense"], help="kernels timed")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--heads", type=int, default=8, help="query heads on the device (e.g. Qwen3-8B's 32 / 4-way tensor)")
  p.add_argument("--kv-heads", type=int, default=2)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  if not args.time and "JAX_PLATFORMS" not in os.environ:
    jax.config.update("jax_platforms", "cpu")  # the TPU or GPU target is compile-only, from this host

  seg_RT, end_RT, info = paper_rows(args)
  out = {"data": info, "skips": [skip_figures(seg_RT, end_RT, b) for b in args.blocks]}
  if args.compile:
    out["compiled"] = compile_figures(seg_RT[0], end_RT[0], args.compile_block, args)
  if args.time:
    out["timed"] = time_kernels(seg_RT[:args.time_rows], end_RT[:args.time_rows], heads=args.heads,
                                kv_heads=args.kv_heads, head_dim=args.head_dim, block=args.compile_block,
                                impls=tuple(args.impls), repeats=args.repeats, gpu_block=args.gpu_block,
                                seed=args.seed)
  out["environment"] = describe_environment()
  if args.json:
    print(json.dumps(out))
  else:
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, indent=1))
  return out


if __name__ == "__main__":
  main()
