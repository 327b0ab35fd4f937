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
row, bf16, per-device heads (`--heads`, `--kv-heads`, `--head-dim`), for one chip of `--topology`:
XLA's memory analysis (argument / output / scratch bytes) and cost analysis (FLOPs, bytes accessed) of
each compiled program. Cost analysis does not see inside a Pallas kernel, so the kernel's FLOPs are
counted analytically (`pallas_attention_flops`) from the first row's visible blocks, and its block
traffic to HBM by hand (`kernel_hbm_bytes`); nor does it multiply a loop body by its trip count, so the
blocked kernel's FLOPs are counted by hand as well (`analytic_flops`, from its own skip rule).

  python benchmarks/tree_attention_kernels.py --json [--row-len 65536] [--blocks 128 256 512] [--compile]
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the TPU target is compile-only, from the CPU host
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # libtpu's machine-wide lock: not needed to compile

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.environment import describe as describe_environment
from clawjax.models import attention
from clawjax.models.pallas_attention import block_table, pallas_attention_flops
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


def compile_figures(seg_T: np.ndarray, end_T: np.ndarray, block: int, args) -> dict:
  from jax.experimental import topologies
  device = topologies.get_topology_desc(platform="tpu", topology_name=args.topology).devices[0]
  t, n, kv, h = seg_T.shape[0], args.heads, args.kv_heads, args.head_dim
  one = jax.sharding.SingleDeviceSharding(device)
  specs = (jax.ShapeDtypeStruct((1, t, n, h), jnp.bfloat16, sharding=one),
           *[jax.ShapeDtypeStruct((1, t, kv, h), jnp.bfloat16, sharding=one)] * 2,
           *[jax.ShapeDtypeStruct((1, t), jnp.int32, sharding=one)] * 2)
  visible = int(np.asarray(block_table(jnp.asarray(seg_T[None]), jnp.asarray(end_T[None]), block)).sum())
  out = {"device": device.device_kind, "T": t, "heads": n, "kv_heads": kv, "head_dim": h, "block": block,
         "visible_blocks": visible}
  for impl in ("pallas", "blocked"):
    kernel = attention.KERNELS[impl]

    def loss(q, k, v, seg, end):
      return jnp.sum(kernel(q, k, v, seg, end, block=block).astype(jnp.float32))

    start = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*specs).compile()
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    out[impl] = {"compile_s": round(time.perf_counter() - start, 1),
                 "argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
                 "temp_bytes": mem.temp_size_in_bytes, "xla_flops": float(cost.get("flops", 0.0)),
                 "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
                 "tpu_custom_calls": compiled.as_text().count("tpu_custom_call")}
  # XLA counts a loop body once, so "blocked" is counted by hand too: per block its skip rule keeps,
  # 2 forward matmuls, 2 + 2 recomputed (the query block's and the key step's remat) and 4 backward.
  out["blocked"]["needed_blocks"] = needed = blocked_needed_blocks(seg_T, end_T, block)
  out["blocked"]["analytic_flops"] = 10 * 2.0 * needed * block * block * h * n
  out["pallas"]["kernel_flops"] = pallas_attention_flops(visible, block, h, n)
  out["pallas"]["kernel_hbm_bytes"] = pallas_hbm_bytes(visible, t // block, block, n, kv, h)
  return out


def blocked_needed_blocks(seg_T: np.ndarray, end_T: np.ndarray, block: int) -> int:
  """Key blocks the "blocked" kernel computes (its `block_needed` rule), summed over query blocks."""
  nb = seg_T.shape[0] // block
  seg_n1B, end_n1B = (jnp.asarray(x.reshape(nb, 1, block)) for x in (seg_T, end_T))
  starts = jnp.arange(nb) * block
  one_q = lambda qs, q_seg: jax.vmap(lambda ks, k_seg, k_end: attention.block_needed(
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
  p.add_argument("--compile", action="store_true", help="also compile pallas and blocked for a TPU target")
  p.add_argument("--compile-block", type=int, default=512)
  p.add_argument("--topology", default="v5e:2x2")
  p.add_argument("--heads", type=int, default=8, help="query heads on the device (e.g. Qwen3-8B's 32 / 4-way tensor)")
  p.add_argument("--kv-heads", type=int, default=2)
  p.add_argument("--head-dim", type=int, default=128)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)

  seg_RT, end_RT, info = paper_rows(args)
  out = {"data": info, "skips": [skip_figures(seg_RT, end_RT, b) for b in args.blocks]}
  if args.compile:
    out["compiled"] = compile_figures(seg_RT[0], end_RT[0], args.compile_block, args)
  out["environment"] = describe_environment()
  if args.json:
    print(json.dumps(out))
  else:
    print(json.dumps({k: v for k, v in out.items() if k != "environment"}, indent=1))
  return out


if __name__ == "__main__":
  main()
