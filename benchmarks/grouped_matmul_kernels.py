"""The MoE experts' grouped matmul per kernel on JAX's default device: one expert projection (x [rows, k]
times w [experts, k, n], rows sorted by expert) forward and both gradients, compiled once, then timed,
beside each kernel's errors from its check (clawjax/kernels/grouped_matmul/check.py).

Shapes default to a Qwen3-30B-A3B layer's gate projection on an 8K-token row: 8,192 tokens x top 8 =
65,536 rows, k = 2,048, n = 768, 128 experts, the rows split over the experts as a uniform router splits
them. On a CPU the TPU kernel runs in the Pallas interpreter: pass small sizes.

  python benchmarks/grouped_matmul_kernels.py --json [--kernels mosaic_gpu xla] [--tokens 8192]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.kernels.grouped_matmul.check import max_errors, platform_kernel
from clawjax.kernels.grouped_matmul.dispatch import KERNELS, grouped_matmul, takes


def time_kernel(kernel: str, *, rows: int, k: int, n: int, experts: int, dtype: str, repeats: int,
                seed: int = 0) -> dict[str, Any]:
  """Seconds of the forward + the gradients of x and w (`step_s`: the median of `repeats` runs after a
  compiling one) and their TFLOP/s (3 matmuls of 2 rows k n each)."""
  rng = np.random.default_rng(seed)
  group_sizes = jnp.asarray(np.bincount(rng.integers(0, experts, rows), minlength=experts), jnp.int32)
  keys = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(keys[0], (rows, k), dtype)
  w = jax.random.normal(keys[1], (experts, k, n), dtype) * k ** -0.5
  dy = jax.random.normal(keys[2], (rows, n), dtype)

  def forward_and_backward(x, w):
    y, vjp = jax.vjp(lambda x, w: grouped_matmul(x, w, group_sizes, kernel), x, w)
    return (y, *vjp(dy))

  start = time.perf_counter()
  compiled = jax.jit(forward_and_backward).lower(x, w).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(compiled(x, w))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(x, w))
    times.append(time.perf_counter() - start)
  step_s = statistics.median(times)
  return {"compile_s": round(compile_s, 2), "step_s": step_s, "steps_s": [round(t, 6) for t in times],
          "tflops_per_s": 3 * 2.0 * rows * k * n / step_s / 1e12}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--kernels", nargs="+", choices=KERNELS, default=None,
                 help="kernels timed (default: the platform's kernel and xla)")
  p.add_argument("--tokens", type=int, default=8192)
  p.add_argument("--top-k", type=int, default=8)
  p.add_argument("--k", type=int, default=2048, help="contraction (d_model for gate / up)")
  p.add_argument("--n", type=int, default=768, help="output columns (moe_mlp_dim for gate / up)")
  p.add_argument("--experts", type=int, default=128)
  p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args(argv)
  device = jax.devices()[0]
  kernels = args.kernels or [platform_kernel(device), "xla"]
  rows = args.tokens * args.top_k
  out: dict[str, Any] = {"device": device.device_kind, "rows": rows, "k": args.k, "n": args.n,
                         "experts": args.experts, "dtype": args.dtype}
  for kernel in kernels:
    if not takes(kernel, args.dtype):
      out[kernel] = {"skipped": f"{kernel} takes no {args.dtype}"}
      continue
    out[kernel] = {**time_kernel(kernel, rows=rows, k=args.k, n=args.n, experts=args.experts, dtype=args.dtype,
                                 repeats=args.repeats),
                   "errors": max_errors(kernel, device)}
  print(json.dumps(out) if args.json else "\n".join(f"{k:10s} {v}" for k, v in out.items()))
  return out


if __name__ == "__main__":
  main()
