"""Real Claude Code and real OpenClaw through the shim on a real engine: the embedded JAX engine.

The other harness tests stand a scripted policy in for the model; here every token comes from the
engine. The model is the `test-tiny` preset: Qwen3's architecture, vocabulary and chat template at
toy width, with random weights, so the harness's whole prompt (system prompt and tool schemas, 9-12K
tokens) is prefilled and a reply of random tokens is sampled, which the harness takes as its final
answer. (SmolLM2, the real weights on this machine, has an 8K context: too short for these prompts.)

The reply is cut at the shim's --max-new-tokens, below what the harness asked for. OpenClaw shows it
truncated and stops. Claude Code re-sends the conversation with the cut reply echoed and an "Output
token limit hit. Resume directly" reminder, three times, then gives up ("response exceeded the 128000
output token maximum"): its later calls each echo every earlier reply, random tokens in many scripts
that re-tokenising would not reproduce.

Checked: the rollout ends with every call logged and ok, each echoed reply spliced back as the ids the
engine sampled (zero drift); the log-probs of the first and the last call are the engine's, against an
independent reference: a full forward pass of the same model (same preset, same seed) over the logged
input + output ids, without the engine's KV cache, chunked prefill or sampler.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.calllog import CallLogWriter
from clawjax.models.loading import load_model
from clawjax.harness.adapters import HarnessOptions
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.models.model import causal_inputs
from clawjax.serving.backends.base import create_backend
from clawjax.serving.server import ShimConfig, ShimThread

from tests.harness.helpers import dumps, install_or_skip, load_rollout, mode_id

pytestmark = [pytest.mark.harness, pytest.mark.slow]

MODEL, SEED = "test-tiny", 0
MAX_NEW_TOKENS = 24


# Claude Code also with --incremental-stream: the random replies, streamed as sampled, split UTF-8
# characters across tokens, and what the harness echoes back is what it was streamed.
@pytest.fixture(scope="module",
                params=[("claude_code", False), ("claude_code", True), ("openclaw", False)],
                ids=mode_id)
def engine_run(request, template, hello_task, tmp_path_factory):
  name, incremental = request.param
  install_or_skip(name)
  tmp = tmp_path_factory.mktemp(name)
  # The paper's 64K window (the shim's default), below which Claude Code compacts after every call.
  backend = create_backend("embedded", model=MODEL, init_seed=SEED, max_slots=2, max_seq_len=65536,
                           prefill_chunk=2048)
  config = ShimConfig(log_dir=str(tmp / "logs"), max_new_tokens=MAX_NEW_TOKENS,
                      incremental_stream=incremental)
  rollout_config = RolloutConfig(timeout_s=600, settle_interval_s=0.2, work_root=str(tmp / "work"),
                                 harness=HarnessOptions(max_turns=2, timeout_s=540))
  with contextlib.ExitStack() as stack:
    shim = stack.enter_context(ShimThread(config, backend, template))
    writer = stack.enter_context(CallLogWriter(tmp / "logs" / "rollouts.jsonl"))
    outcome = run_rollout(shim.url, hello_task, name, rollout_config, writer,
                          admin_token=shim.admin_token)
  return (name, outcome, *load_rollout(tmp / "logs", outcome.record.rollout_id))


def test_real_harness_on_real_engine_logs_every_call(engine_run):
  name, outcome, calls, logged, tree = engine_run
  rec = outcome.record
  assert logged == rec and rec.status == "ok", dumps(rec.extra)
  assert calls and [c.call_index for c in calls] == list(range(len(calls)))
  assert rec.extra["n_calls"] == len(calls)
  for c in calls:
    assert c.status == "ok", dumps(c.extra)
    assert len(c.input_ids) > 5000  # the harness's real prompt, prefilled by the engine
    assert 0 < len(c.output_ids) <= MAX_NEW_TOKENS and len(c.output_logprobs) == len(c.output_ids)
    assert c.policy_version == 0
    assert c.extra["drifted_turns"] == 0 and c.extra["spliced_turns"] == c.call_index
  assert tree.drift_calls == 0 and all(reason == "train" for reason in tree.reasons.values())
  if name == "claude_code":  # its resume-after-max_tokens calls (module docstring)
    assert len(calls) == 4, dumps(rec.extra)


def test_engine_logprobs_match_a_full_forward_pass(engine_run):
  """The logged log-probs are those of the logged ids under the model: a float32 forward pass over the
  whole sequence (no cache) gives the same values. Off by one position, they would differ by ~1 nat."""
  _, _, calls, _, _ = engine_run
  model = load_model(MODEL, seed=SEED, attention_impl="blocked").model
  # The first call, and the last, whose context holds every echoed reply (~8 s of CPU each).
  for c in {calls[0].call_index: calls[0], calls[-1].call_index: calls[-1]}.values():
    ids = np.asarray(c.input_ids + c.output_ids, np.int32)[None]
    hidden_1TD = model.hidden(*causal_inputs(jnp.asarray(ids)))
    # Only the positions that predict an output token: the full vocab at 12K positions is ~7 GB.
    n_in, n_out = len(c.input_ids), len(c.output_ids)
    logits_KV = model.logits(hidden_1TD[0, n_in - 1:n_in - 1 + n_out])
    reference = jax.nn.log_softmax(logits_KV)[np.arange(n_out), np.asarray(c.output_ids)]
    np.testing.assert_allclose(np.asarray(c.output_logprobs), np.asarray(reference), atol=1e-4)
