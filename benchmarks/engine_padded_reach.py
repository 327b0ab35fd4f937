"""What a padded batch reads from the engine's KV cache. A batch of 3 rows runs as 4 (powers of two), the
padding row placed at the cache's end (capacity - 1). The cached attention reads key blocks up to the last
one a query reaches; when that reach counted the padding row (before), every row of the batch read the
whole cache; it now counts the real rows only (kv_forward.cached_attention's `reach`).

  python benchmarks/engine_padded_reach.py [--json] [--parts attention dispatch] [--baseline CHECKOUT]

attention: one layer's cached attention in the model's shape (`--model`'s heads), a cache of
  `--max-seq-len` + 512 positions, rows at positions `--long-len` and `--other-len` (twice) plus the
  padding row: a decode step (one query a row) and a prefill dispatch (a 512-token chunk a row), each
  timed with the reach of the padding row (what was computed before) and of the real rows (now), in turns
  in this process. Per variant: ms per call (median of `--repeats`), key blocks read, and the keys and
  values read per row.
dispatch: the model (as `load_model` gives it) in an Engine with `--max-seq-len`: 3 requests admitted together
  (prompts of `--long-len`, `--other-len`, `--other-len` tokens, each longer than a 512-token chunk: their
  second chunks share a padded dispatch past 512 cached keys), `--new-tokens` each: seconds to every
  first token (the prefill dispatches) and decoded tokens per second, after a warm-up pass with other
  prompts. This checkout, and with `--baseline` another checkout's clawjax (e.g. `git worktree add
  /tmp/base REV`) in a process of its own (engine_throughput.EngineProcess), in turns (`--rounds`):
  read the ratios.
CPU timings depend on the machine's load, reported at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.engine.kv_forward import cached_attention
from clawjax.environment import describe as describe_environment
from clawjax.generation import SamplingParams
from clawjax.models.config import PRESETS

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = EngineConfig.attention_block
PREFILL_CHUNK = EngineConfig.prefill_chunk


def _median_ms(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # compiles
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times) * 1e3


def attention(model: str, max_seq_len: int, long_len: int, other_len: int, repeats: int) -> dict[str, Any]:
  """One layer's cached attention over the padded batch, reach before (the padding row's) and now."""
  cfg = PRESETS[model]
  capacity = max_seq_len + PREFILL_CHUNK
  rng = np.random.default_rng(0)
  k_cache, v_cache = (jnp.asarray(rng.normal(size=(1, 4, cfg.n_kv_heads, capacity, cfg.head_dim)), jnp.float32)
                      for _ in range(2))
  slots_B = jnp.arange(4, dtype=jnp.int32)
  out: dict[str, Any] = {}
  for kind, t in (("decode", 1), ("prefill", PREFILL_CHUNK)):
    # Each row's last query at its length; the padding row's chunk ends at the cache's end.
    ends = np.array([long_len, other_len, other_len, capacity], np.int32)
    positions_BT = jnp.asarray(ends[:, None] - t + np.arange(t, dtype=np.int32)[None])
    q_BTNH = jnp.asarray(rng.normal(size=(4, t, cfg.n_heads, cfg.head_dim)), jnp.float32)
    cache_len = min(capacity, 1 << (long_len - 1).bit_length())
    run = jax.jit(lambda q, k, v, reach, cache_len=cache_len: cached_attention(q, k, v, 0, slots_B, positions_BT,
                                                                                cache_len, BLOCK, reach))
    reaches = {"before": capacity - 1, "now": long_len - 1}
    row: dict[str, Any] = {"cache_len": cache_len}
    times: dict[str, list[float]] = {name: [] for name in reaches}
    for _ in range(2):  # in turns
      for name, reach in reaches.items():
        times[name].append(_median_ms(lambda reach=reach: run(q_BTNH, k_cache, v_cache, jnp.int32(reach)), repeats))
    for name, reach in reaches.items():
      blocks = reach // BLOCK + 1
      row[name] = {"ms": statistics.median(times[name]), "blocks": blocks,
                   "kv_bytes_per_row": 2 * blocks * BLOCK * cfg.n_kv_heads * cfg.head_dim * 4}
    row["before_over_now"] = round(row["before"]["ms"] / row["now"]["ms"], 2)
    out[kind] = row
  return out


def padded_batch(model, max_seq_len: int, long_len: int, other_len: int, new_tokens: int, seed: int
                 ) -> dict[str, Any]:
  """An engine's 3 requests admitted together (a warm-up pass, then the timed one): seconds to every first
  token, decoded tokens per second, and the engine's counters of the timed pass."""
  engine = Engine(model, EngineConfig(max_slots=4, max_seq_len=max_seq_len))
  rng = np.random.default_rng(seed)
  sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=seed)
  out: dict[str, Any] = {}
  try:
    for label in ("warmup", "timed"):
      firsts: dict[int, float] = {}
      prompts = [[int(x) for x in rng.integers(3, engine.runner.vocab_size, n)] for n in (long_len, other_len, other_len)]
      before = engine.stats()
      t0 = time.perf_counter()
      with engine._cv:  # pylint: disable=protected-access  (queued at once: admitted together)
        futures = [engine.submit(p, sampling, lambda ids, lps, i=i: firsts.setdefault(i, time.perf_counter()))
                   for i, p in enumerate(prompts)]
      results = [f.result() for f in futures]
      wall = time.perf_counter() - t0
      after = engine.stats()
      first_s = max(firsts.values()) - t0
      decoded = after["tokens_decoded"] - before["tokens_decoded"]
      out[label] = {"first_tokens_s": first_s, "decode_tok_s": decoded / (wall - first_s), "wall_s": wall,
                    "tokens": sum(len(r.output_ids) for r in results),
                    **{k: after[k] - before[k] for k in ("decode_dispatches", "prefill_dispatches")}}
  finally:
    engine.close()
  return out


def compare_dispatch(args: argparse.Namespace) -> dict[str, Any]:
  from engine_throughput import EngineProcess  # pylint: disable=import-outside-toplevel
  bench_dir = pathlib.Path(__file__).resolve().parent
  contenders = {"now": EngineProcess(ROOT, args.model, "engine_padded_reach", bench_dir)}
  try:
    if args.baseline:
      contenders["baseline"] = EngineProcess(pathlib.Path(args.baseline).resolve(), args.model,
                                             "engine_padded_reach", bench_dir)
    rounds: dict[str, list[dict]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
      for name, proc in contenders.items():
        rounds[name].append(proc.run("padded_batch", args.max_seq_len, args.long_len, args.other_len,
                                     args.new_tokens, args.seed)["timed"])
        print(f"{name}: {rounds[name][-1]}", file=sys.stderr, flush=True)
  finally:
    for proc in contenders.values():
      proc.close()
  out: dict[str, Any] = {}
  for name, rs in rounds.items():
    out[name] = {key: statistics.median(r[key] for r in rs) for key in ("first_tokens_s", "decode_tok_s")}
    out[name] |= {"rounds": rs}
  if "baseline" in out:
    out["decode_now_over_baseline"] = round(out["now"]["decode_tok_s"] / out["baseline"]["decode_tok_s"], 2)
    out["first_tokens_baseline_over_now"] = round(out["baseline"]["first_tokens_s"] / out["now"]["first_tokens_s"], 2)
  return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--parts", nargs="+", choices=("attention", "dispatch"), default=["attention", "dispatch"])
  parser.add_argument("--max-seq-len", type=int, default=8192)
  parser.add_argument("--long-len", type=int, default=1000)
  parser.add_argument("--other-len", type=int, default=600)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--baseline", default=None, help="a clawjax checkout measured side by side")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  results: dict[str, Any] = {"model": args.model, "max_seq_len": args.max_seq_len, "long_len": args.long_len,
                             "other_len": args.other_len, "attention_block": BLOCK,
                             "load_avg_1m_start": os.getloadavg()[0]}
  if "attention" in args.parts:
    results["attention"] = attention(args.model, args.max_seq_len, args.long_len, args.other_len, args.repeats)
  if "dispatch" in args.parts:
    results["dispatch"] = compare_dispatch(args)
  results["load_avg_1m_end"] = os.getloadavg()[0]
  results["environment"] = describe_environment()
  print(json.dumps(results) if args.json else "\n".join(f"{k:20s} {v}" for k, v in results.items()))
  return results


if __name__ == "__main__":
  main()
