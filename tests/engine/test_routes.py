"""The engine records routes (`EngineConfig.record_routes`): every position a request computed, from its
prefill (chunked), from the prefix cache where it reused a prefix, and from the decode loop, equals the
expert choice an independent float64 forward of the whole sequence makes; recording changes no sampled
token or log-prob; off, nothing is recorded. Replayed by the learner (float32, the same weights), those
routes change no log-prob and disagree nowhere."""
import dataclasses

import numpy as np
from flax import nnx

from clawjax.calllog import RolloutRecord
from clawjax.engine.engine import Engine, EngineConfig
from clawjax.generation import SamplingParams
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder
from clawjax.rl.advantages import grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.routes import RoutedExperts
from clawjax.tree.build import build_tree
from clawjax.tree.pack import pack_paths

from tests.rl import moe_reference
from tests.tree.reference import make_call

MOE = PRESETS["test-tiny-moe"].replace(vocab_size=256, mlp_only_layers=(0,))  # a dense layer, a MoE layer
CONFIG = EngineConfig(max_slots=4, max_seq_len=128, prefill_chunk=16, min_bucket=16, decode_steps=4,
                      decode_steps_busy=4)


def live_routes(model, seq) -> np.ndarray:
  """The float64 reference's expert choices at positions 0 .. len(seq) - 2, [n, moe_layers, top_k]."""
  return np.stack(moe_reference.forward(model, np.asarray(seq))[1], axis=1)[:-1]


def test_recorded_routes_are_the_models_choices_at_every_computed_position():
  model = Decoder(MOE, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, 256, n).tolist() for n in (40, 7, 23)]  # 40: three prefill chunks
  params = SamplingParams(max_new_tokens=9, temperature=1.0, seed=3)
  engines = [Engine(model, dataclasses.replace(CONFIG, record_routes=record)) for record in (True, False)]
  try:
    recorded, plain = ([f.result(timeout=300) for f in [e.submit(p, params) for p in prompts]] for e in engines)
    # A call continuing the first: its prefix comes from the cache, with the routes stored beside it.
    follow = prompts[0] + list(recorded[0].output_ids) + [5, 6, 7]
    again = engines[0].submit(follow, params).result(timeout=300)
  finally:
    for e in engines:
      e.close()
  for p, r, q in zip(prompts, recorded, plain):
    assert r.output_ids == q.output_ids and r.output_logprobs == q.output_logprobs and q.routed_experts is None
    seq = p + list(r.output_ids)
    assert r.routed_experts.shape == (len(seq) - 1, 1, MOE.top_k) and r.routed_experts.dtype == np.uint8
    np.testing.assert_array_equal(np.sort(r.routed_experts, -1), np.sort(live_routes(model, seq), -1))
  assert again.cached_tokens > len(prompts[0])
  np.testing.assert_array_equal(np.sort(again.routed_experts, -1),
                                np.sort(live_routes(model, follow + list(again.output_ids)), -1))


def test_the_learner_replaying_the_engines_routes_changes_nothing():
  model = Decoder(MOE, rngs=nnx.Rngs(0))
  engine = Engine(model, dataclasses.replace(CONFIG, record_routes=True))
  rng = np.random.default_rng(1)
  try:
    prompt = rng.integers(0, 256, 30).tolist()
    first = engine.submit(prompt, SamplingParams(max_new_tokens=8, seed=1)).result(timeout=300)
    follow = prompt + list(first.output_ids) + [9, 10]
    second = engine.submit(follow, SamplingParams(max_new_tokens=8, seed=2)).result(timeout=300)
  finally:
    engine.close()
  calls = [dataclasses.replace(make_call(i, ids, r.output_ids), output_logprobs=r.output_logprobs,
                               routed_experts=RoutedExperts(0, r.routed_experts))
           for i, (ids, r) in enumerate([(prompt, first), (follow, second)])]
  scores = grpo_advantages([RolloutRecord("r", "t", "h", 1.0, "ok"), RolloutRecord("s", "t", "h", 0.0, "ok")])
  batch = pack_paths([build_tree("r", calls)], scores, row_len=64)
  logp, metrics = {}, {}
  for mode in ("off", "auto"):
    learner = Learner(LearnerConfig(logits_chunk=16, routing_replay=mode), Decoder(MOE, rngs=nnx.Rngs(0)))
    logp[mode] = np.asarray(learner.old_pass(batch)["logp_old"])
    metrics[mode] = learner.loss_and_grads(batch)[2]
  np.testing.assert_allclose(logp["auto"], logp["off"], atol=1e-6)
  assert metrics["auto"]["routing/replayed_frac"] == 1.0 and metrics["auto"]["routing/disagree_frac"] == 0.0
  assert metrics["auto"]["mean_abs_logp_old_minus_rollout"] < 1e-4  # float32 engine and learner: the same
