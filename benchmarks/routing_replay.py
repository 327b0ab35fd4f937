"""What rollout routing replay costs and what it buys, on test-tiny-moe (CPU):

  python benchmarks/routing_replay.py [--json] [--parts engine learner log mismatch] [--rounds 3]

engine: embedded-engine decode tok/s with and without `EngineConfig.record_routes`, at 1 and 16 requests
  (`--new-tokens` each from short random prompts, temperature 1), the two engines taking turns round by
  round so that the machine's load falls on both alike; the median round. The ratio is the figure.
learner: one learner step (pi_old pass + update) on a packed rollout batch whose calls logged routes,
  replaying them (`routing_replay="auto"`) and not (`"off"`), side by side; the median of `--rounds`.
log: an 8-call rollout (each call's input is the last one's input + output + a 40-token tool result)
  through the engine and the shim's log writer: the bytes of routes the call log holds (its sidecar)
  against the rollout's unique tree tokens x MoE layers x top_k (one byte an id), and what a log without
  the input_ref dedup would hold (every call's whole context).
mismatch: the engine in bfloat16 (weights, activations and cache), the learner in float32 on the same
  weights: of the replayed (token, MoE layer) pairs, the share whose float32 top-k differs from the
  engine's (routing/disagree_frac), and mean |log pi_engine - log pi_old| on trained tokens with replay on
  and off.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import statistics
import tempfile
import time

import numpy as np
from flax import nnx

from clawjax.calllog import ROUTES_SUFFIX, CallRecord, RolloutRecord, load
from clawjax.engine.engine import Engine, EngineConfig
from clawjax.environment import describe as describe_environment
from clawjax.generation import SamplingParams
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.routes import RoutedExperts
from clawjax.serving.logwriter import RolloutLogWriter, own_routes
from clawjax.tree.build import build_tree
from clawjax.tree.pack import pack_trees

CFG = PRESETS["test-tiny-moe"]


def _engine(model, record: bool, **kw) -> Engine:
  return Engine(model, EngineConfig(max_slots=16, max_seq_len=1024, record_routes=record, **kw))


def _decode(engine: Engine, requests: int, new_tokens: int, seed: int) -> float:
  rng = np.random.default_rng(seed)
  prompts = [rng.integers(0, CFG.vocab_size, 16).tolist() for _ in range(requests)]
  params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
  start = time.perf_counter()
  results = [f.result() for f in [engine.submit(p, params) for p in prompts]]
  return sum(len(r.output_ids) for r in results) / (time.perf_counter() - start)


def engine_part(args) -> dict:
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  engines = {record: _engine(model, record) for record in (False, True)}
  out = {}
  try:
    for n in (1, 16):
      for e in engines.values():  # compile every program the timed rounds use
        _decode(e, n, args.new_tokens, 0)
      rounds = {record: [] for record in engines}
      for k in range(args.rounds):
        for record, e in engines.items():
          rounds[record].append(_decode(e, n, args.new_tokens, k + 1))
      off, on = (statistics.median(rounds[r]) for r in (False, True))
      out[f"requests_{n}"] = {"tok_s_without": off, "tok_s_recording": on, "ratio": on / off}
  finally:
    for e in engines.values():
      e.close()
  return out


def rollout(engine: Engine, calls: int, seed: int, temperature: float = 1.0) -> list[CallRecord]:
  """`calls` calls of one rollout through `engine`, each continuing the last (input + output + a tool
  result), with the engine's routes and log-probs."""
  rng = np.random.default_rng(seed)
  ids, out = rng.integers(0, CFG.vocab_size, 200).tolist(), []
  for i in range(calls):
    r = engine.submit(ids, SamplingParams(max_new_tokens=24, temperature=temperature, seed=seed * 100 + i)).result()
    out.append(CallRecord(rollout_id=f"r{seed}", task_id="t", harness="h", call_index=i, status="ok",
                          input_ids=tuple(ids), output_ids=r.output_ids, output_logprobs=r.output_logprobs,
                          role="main", finish_reason=r.finish_reason, model="m", t_start=0.0, t_end=1.0,
                          policy_version=0, routed_experts=RoutedExperts(0, r.routed_experts)))
    ids = ids + list(r.output_ids) + rng.integers(0, CFG.vocab_size, 40).tolist()
  return out


def log_part(args) -> dict:
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  engine = _engine(model, True)
  try:
    calls = rollout(engine, 8, 1)
  finally:
    engine.close()
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "r.jsonl")
    with RolloutLogWriter(path) as writer:  # as the shim writes them
      for c in calls:
        encoded = writer.encode_ids(c.input_ids, c.call_index)
        routes, _ = own_routes(c.routed_experts, encoded.routes_from, len(c.input_ids) + len(c.output_ids) - 1)
        writer.write_call(dataclasses.replace(c, routed_experts=routes), encoded)
    stored = os.path.getsize(path + ROUTES_SUFFIX)
    loaded = load(path).calls["r1"]
  tree = build_tree("r1", loaded)
  per_token = CFG.top_k * sum(CFG.is_moe_layer(i) for i in range(CFG.n_layers))
  unique = tree.size * per_token
  whole = sum(len(c.input_ids) + len(c.output_ids) - 1 for c in calls) * per_token
  return {"calls": len(calls), "route_bytes_in_log": stored, "unique_tree_tokens": tree.size,
          "unique_bytes": unique, "ratio": stored / unique, "without_dedup_bytes": whole}


def _batch(calls_of: list[list[CallRecord]]):
  trees = [build_tree(calls[0].rollout_id, calls) for calls in calls_of]
  scores = grpo_advantages([RolloutRecord(t.rollout_id, "t", "h", float(i % 2), "ok") for i, t in enumerate(trees)])
  return pack_trees(trees, scores, row_len=-(-max(t.size for t in trees) // 128) * 128)


def learner_part(args) -> dict:
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  engine = _engine(model, True)
  try:
    batch = _batch([rollout(engine, 4, s) for s in range(4)])
  finally:
    engine.close()
  learners = {mode: Learner(LearnerConfig(lr=1e-4, logits_chunk=128, routing_replay=mode),
                            Decoder(CFG, rngs=nnx.Rngs(0))) for mode in ("off", "auto")}
  times = {mode: [] for mode in learners}
  for k in range(args.rounds + 1):
    for mode, l in learners.items():
      seconds = l.step(batch)["step_seconds"]
      if k:  # (round 0 compiles)
        times[mode].append(seconds)
  off, on = (statistics.median(times[m]) for m in ("off", "auto"))
  return {"tokens": int((batch.segment_ids_RT > 0).sum()), "step_s_without": off, "step_s_replay": on,
          "ratio": on / off}


def mismatch_part(args) -> dict:
  learner_model = Decoder(CFG, rngs=nnx.Rngs(0))
  # The same float32 weights (the same init), computed in bfloat16: the engine narrows them to it.
  engine = _engine(Decoder(CFG.replace(dtype="bfloat16"), rngs=nnx.Rngs(0)), True, cache_dtype="bfloat16")
  try:
    batch = _batch([rollout(engine, 4, s) for s in range(8)])
  finally:
    engine.close()
  out = {}
  for mode in ("off", "auto"):
    m = Learner(LearnerConfig(logits_chunk=128, routing_replay=mode), learner_model).loss_and_grads(batch)[2]
    out[mode] = {k: m[k] for k in m if k.startswith("routing/") or k.endswith("logp_old_minus_rollout")}
  return {"replay_off": out["off"], "replay_on": out["auto"]}


PARTS = {"engine": engine_part, "learner": learner_part, "log": log_part, "mismatch": mismatch_part}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--new-tokens", type=int, default=1000)
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args(argv)
  result = {"environment": describe_environment(), "loadavg_before": os.getloadavg()}
  for name in args.parts:
    result[name] = PARTS[name](args)
  result["loadavg_after"] = os.getloadavg()
  print(json.dumps(result) if args.json else json.dumps(result, indent=2))
  return result


if __name__ == "__main__":
  main()
