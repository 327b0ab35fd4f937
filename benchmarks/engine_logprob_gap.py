"""The learner/engine log-prob gap by KV-cache dtype, on CPU as the proxy for an accelerator's bf16 cache.

  python benchmarks/engine_logprob_gap.py [--json] [--requests 8] [--new-tokens 64] [--toy]

For each (compute dtype, cache dtype) of SmolLM2-135M-Instruct (`--toy`: SmolLM2's architecture at the
quickstart's toy size, random weights): `--requests` chat prompts (SmolLM2's template) sampled
at temperature 1 through the embedded engine, then every sampled token's log-prob recomputed by the
learner's computation (one full causal forward of prompt + output in the same compute dtype, the
log-prob convention of clawjax/engine/sampling.py). Reported as the learner's TIS metrics report it:
mean and max |logp_learner - logp_engine| over the tokens, the fraction whose pi_old / pi_rollout exceeds
c_bar (tis_truncated_fraction), and that ratio's extremes. In float32 the gap is float rounding; a
bfloat16 cache rounds the keys and values of a float32-compute model (not of a bfloat16-compute one,
whose keys and values are bfloat16 already).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.engine.sampling import token_logprobs
from clawjax.environment import describe as describe_environment
from clawjax.generation import SamplingParams
from clawjax.models.loading import load_model, real_preset_dir
from clawjax.models.model import causal_inputs
from clawjax.rl.config import LearnerConfig

QUESTIONS = ("What is 2+2?", "Name three primary colours.", "Write a haiku about the sea.",
             "How do I list files in a directory with Python?", "What is the capital of France?",
             "Explain recursion in one sentence.", "Give me a word that rhymes with cat.",
             "What does a compiler do?", "Translate 'good morning' into Spanish.", "Why is the sky blue?")


MODEL = "smollm2-135m"
TOY = dict(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=256)  # configs/quickstart.py


def _chat_prompts(n: int) -> list[list[int]]:
  from tokenizers import Tokenizer  # pylint: disable=import-outside-toplevel
  tok = Tokenizer.from_file(str(pathlib.Path(real_preset_dir(MODEL)) / "tokenizer.json"))
  text = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
  return [tok.encode(text.format(QUESTIONS[i % len(QUESTIONS)]), add_special_tokens=False).ids for i in range(n)]


def _learner_logprobs(model, ids: list[int], output: tuple[int, ...]) -> np.ndarray:
  seq = jnp.asarray([list(ids) + list(output)], jnp.int32)
  logits_TV = model(*causal_inputs(seq))[0]
  n = len(ids)
  return np.asarray(token_logprobs(logits_TV[n - 1:-1], jnp.asarray(output, jnp.int32),
                                   jnp.ones(len(output), jnp.float32)))


def measure(model, prompts: list[list[int]], new_tokens: int, cache_dtype: str, c_bar: float) -> dict[str, float]:
  config = EngineConfig(max_slots=len(prompts), max_seq_len=max(map(len, prompts)) + new_tokens + 1,
                        prefill_chunk=128, min_bucket=64, cache_dtype=cache_dtype)
  engine = Engine(model, config)
  try:
    futures = [engine.submit(p, SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i))
               for i, p in enumerate(prompts)]
    results = [f.result() for f in futures]
  finally:
    engine.close()
  engine_lp = np.concatenate([r.output_logprobs for r in results])
  learner_lp = np.concatenate([_learner_logprobs(model, p, r.output_ids) for p, r in zip(prompts, results)])
  gap = np.abs(learner_lp - engine_lp)
  ratio = np.exp(learner_lp - engine_lp)
  return {"tokens": int(gap.size), "mean_abs_logp_old_minus_rollout": float(gap.mean()),
          "max_abs_logp_old_minus_rollout": float(gap.max()),
          "tis_truncated_fraction": float(np.mean(ratio > c_bar)),
          "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}


def main(argv: list[str] | None = None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--toy", action="store_true", help="a toy-size random model of SmolLM2's architecture")
  p.add_argument("--requests", type=int, default=8)
  p.add_argument("--new-tokens", type=int, default=64)
  p.add_argument("--compute", nargs="+", default=["float32", "bfloat16"], help="the model's compute dtypes")
  args = p.parse_args(argv)
  c_bar = LearnerConfig().c_bar
  result: dict = {"model": MODEL, "toy": args.toy, "requests": args.requests, "new_tokens": args.new_tokens, "c_bar": c_bar,
                  "platform": jax.devices()[0].platform, "rows": []}
  prompts = _chat_prompts(args.requests)
  for compute in args.compute:
    loaded = load_model(MODEL, random_init=args.toy, dtype=compute, **(TOY if args.toy else {}))
    for cache in ("float32", "bfloat16"):
      start = time.perf_counter()
      row = {"compute_dtype": compute, "cache_dtype": cache,
             **measure(loaded.model, prompts, args.new_tokens, cache, c_bar)}
      row["seconds"] = round(time.perf_counter() - start, 1)
      print(f"[{time.strftime('%H:%M:%S')}] {row}", file=sys.stderr, flush=True)
      result["rows"].append(row)
  result["environment"] = describe_environment()
  print(json.dumps(result) if args.json else json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  main()
