"""Embedded-engine throughput on SmolLM2-135M-Instruct (CPU): decode tok/s and prefix-cached prefill.

  python benchmarks/engine_throughput.py [--json] [--new-tokens 64] [--prompt-len 4096 --prefix-len 3900]

Measures, after a warm-up pass that compiles every program the timed pass uses:
  decode_tok_s_1, decode_tok_s_16: generated tokens per wall-clock second for 1 and 16 concurrent requests
    (short distinct prompts, `--new-tokens` each, no stop token; the prompts' prefill is included);
  prefill_4k_uncached_s, prefill_4k_cached_s: time to the first token of a `--prompt-len` prompt with an
    empty prefix cache, and when the first `--prefix-len` tokens are cached from an earlier call;
  vllm: vLLM-CPU side by side only when the `vllm` package is importable (not installed here: reported
    as not measured). Compile times are reported separately. CPU timings depend on the machine's load,
    which is reported too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import numpy as np

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.environment import describe as describe_environment
from clawjax.generation import SamplingParams
from clawjax.models.loading import load_model


def _progress(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _prompts(rng: np.random.Generator, n: int, length: int, vocab: int) -> list[list[int]]:
  return [[int(t) for t in rng.integers(3, vocab, length)] for _ in range(n)]


def _timed(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
  t0 = time.perf_counter()
  futures = [engine.submit(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i))
             for i, p in enumerate(prompts)]
  n = sum(len(f.result().output_ids) for f in futures)
  return time.perf_counter() - t0, n


def decode_throughput(model, concurrency: int, new_tokens: int, prompt_len: int, seed: int) -> dict[str, float]:
  engine = Engine(model, EngineConfig(max_slots=concurrency, max_seq_len=prompt_len + new_tokens + 1,
                                      prefill_chunk=64, min_bucket=64))
  try:
    rng = np.random.default_rng(seed)
    vocab = engine.runner.vocab_size
    compile_s, _ = _timed(engine, _prompts(rng, concurrency, prompt_len, vocab), new_tokens)
    _progress(f"decode x{concurrency}: warm-up {compile_s:.1f} s")
    wall_s, n = _timed(engine, _prompts(rng, concurrency, prompt_len, vocab), new_tokens)
    _progress(f"decode x{concurrency}: {n} tokens in {wall_s:.1f} s")
  finally:
    engine.close()
  return {"tok_s": n / wall_s, "wall_s": wall_s, "tokens": n, "warmup_s": compile_s}


def prefill_times(model, prompt_len: int, prefix_len: int, chunk: int, seed: int) -> dict[str, float]:
  engine = Engine(model, EngineConfig(max_slots=2, max_seq_len=prompt_len + 8, prefill_chunk=chunk))
  vocab = engine.runner.vocab_size
  rng = np.random.default_rng(seed)
  one = SamplingParams(max_new_tokens=1, temperature=0.0)

  def first_token_s(ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = engine.submit(ids, one).result()
    return time.perf_counter() - t0, r.cached_tokens

  try:
    out = {}
    for label in ("warmup", "timed"):  # the warm-up compiles the same buckets the timed pass uses
      full = _prompts(rng, 1, prompt_len, vocab)[0]
      engine.flush_cache()
      uncached_s, _ = first_token_s(full)
      engine.flush_cache()
      first_token_s(full[:prefix_len])
      cached_s, cached = first_token_s(full)
      out[label] = {"uncached_s": uncached_s, "cached_s": cached_s, "cached_tokens": cached}
      _progress(f"prefill {label}: {out[label]}")
  finally:
    engine.close()
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--short-prompt-len", type=int, default=32)
  parser.add_argument("--prompt-len", type=int, default=4096)
  parser.add_argument("--prefix-len", type=int, default=3900)
  parser.add_argument("--prefill-chunk", type=int, default=512)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  model = load_model(args.model).model
  results: dict[str, object] = {"model": args.model, "cpus": os.cpu_count(),
                                "load_avg_1m_start": os.getloadavg()[0]}
  for c in (1, 16):
    r = decode_throughput(model, c, args.new_tokens, args.short_prompt_len, args.seed)
    results[f"decode_tok_s_{c}"] = round(r["tok_s"], 2)
    results[f"decode_{c}_detail"] = {k: round(v, 3) for k, v in r.items()}
  p = prefill_times(model, args.prompt_len, args.prefix_len, args.prefill_chunk, args.seed)
  results["prefill_4k_uncached_s"] = round(p["timed"]["uncached_s"], 3)
  results["prefill_4k_cached_s"] = round(p["timed"]["cached_s"], 3)
  results["prefill_detail"] = p
  results["vllm"] = ("installed: run it side by side (not automated here)" if importlib.util.find_spec("vllm")
                     else "not installed: not measured")
  results["load_avg_1m_end"] = os.getloadavg()[0]
  results["environment"] = describe_environment()
  if args.json:
    print(json.dumps(results))
  else:
    for k, v in results.items():
      print(f"{k:28s} {v}")


if __name__ == "__main__":
  main()
