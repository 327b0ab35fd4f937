"""Shared fixtures: a tiny random model (512-token vocabulary) and engines over it."""

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.generation import SamplingParams
from clawjax.models.config import preset
from clawjax.models.model import Decoder, causal_inputs

# One configuration for (almost) every test, so the compiled programs are shared.
SMALL = EngineConfig(max_slots=4, max_seq_len=192, prefill_chunk=64, min_bucket=64)


def tiny_model(seed: int = 0) -> Decoder:
  return Decoder(preset("test-tiny-vocab"), rngs=nnx.Rngs(seed))


REF_LEN = 256  # reference forwards pad to this length: causal, so padding changes no earlier logit


@functools.partial(jax.jit, static_argnums=0)
def _full_logits(graphdef, state, tokens_1T):
  return nnx.merge(graphdef, state)(*causal_inputs(tokens_1T))[0]


def full_logits(model: Decoder, seq) -> np.ndarray:
  """[len(seq), V] float32 logits of a plain causal forward of the whole sequence, no KV cache."""
  padded = np.zeros((1, max(REF_LEN, len(seq))), np.int32)
  padded[0, :len(seq)] = seq
  return np.asarray(_full_logits(*nnx.split(model), padded))[:len(seq)]


def learner_logprobs(model: Decoder, input_ids, output_ids, temperature: float) -> np.ndarray:
  """What the learner computes: one full causal forward of input+output, log softmax(logits / T)."""
  logits_TV = full_logits(model, np.concatenate([input_ids, output_ids]))
  t = temperature if temperature > 0 else 1.0
  logp_TV = jax.nn.log_softmax(jnp.asarray(logits_TV) / t, axis=-1)
  n = len(input_ids)
  return np.asarray(logp_TV[n - 1:-1])[np.arange(len(output_ids)), np.asarray(output_ids)]


@pytest.fixture(scope="module")
def model():
  return tiny_model(0)


@pytest.fixture(scope="module")
def engine(model):
  eng = Engine(model, SMALL)
  yield eng
  eng.close()


def prompt(seed: int, n: int) -> list[int]:
  return [int(t) for t in np.random.default_rng(seed).integers(0, 512, n)]


class Parker:
  """A companion request that parks the engine thread: its token callback (which runs there) waits, from the
  first decoded run it gets while `running` requests hold slots (itself included), until `release()`. The
  other requests stay in their slots mid-generation meanwhile; `parked` is set once the engine waits."""
  PROMPT = prompt(99, 10)
  SAMPLING = SamplingParams(max_new_tokens=60, temperature=0.0)

  def __init__(self, engine, running: int, sampling: SamplingParams = SAMPLING):
    self.parked, self._go = threading.Event(), threading.Event()
    runs = []

    def on_tokens(ids, logprobs):
      runs.append(ids)
      if len(runs) > 1 and not self._go.is_set() and engine.stats()["running"] >= running:
        self.parked.set()
        self._go.wait(120)

    self.future = engine.submit(self.PROMPT, sampling, on_tokens)

  def release(self) -> None:
    self._go.set()
