"""The engine's programs compiled for accelerators on compile-only devices (nothing attached): a decode
chunk and a batched prefill for one H200 and for a TPU v5e 2x2 slice (the weights split over its four
chips), with the KV cache in bfloat16 there by default, while CPU keeps float32."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from clawjax.aot import topology
from clawjax.engine import kv_forward
from clawjax.engine.engine import Engine
from clawjax.engine.kv_forward import DecodeRow, KVRunner, PrefillChunk, cache_dtype
from clawjax.generation import SamplingParams
from clawjax.models.config import preset
from clawjax.models.model import Decoder
from tests.engine.conftest import SMALL, learner_logprobs, prompt


def test_cache_dtype_is_float32_on_cpu_and_bfloat16_on_accelerators():
  assert cache_dtype("auto", "cpu") == jnp.float32
  assert cache_dtype("auto", "gpu") == cache_dtype("auto", "tpu") == jnp.bfloat16
  assert cache_dtype("float32", "tpu") == jnp.float32 and cache_dtype("bfloat16", "cpu") == jnp.bfloat16


def _sampled(model, config, ids, sampling):
  eng = Engine(model, config)
  try:
    assert eng.runner.cache_dtype == jnp.dtype(config.cache_dtype)
    return eng.submit(ids, sampling).result(timeout=300)
  finally:
    eng.close()


def test_a_bfloat16_cache_is_lossless_for_bfloat16_compute_and_close_for_float32(model):
  """Keys and values computed in bfloat16 lose nothing in a bfloat16 cache; computed in float32, rounding
  them moves the log-probs off the learner's (benchmarks/engine_logprob_gap.py measures by how much)."""
  ids, s = prompt(70, 40), SamplingParams(max_new_tokens=12, temperature=1.0, seed=70)
  f32, bf16 = (dataclasses.replace(SMALL, cache_dtype=d) for d in ("float32", "bfloat16"))
  half = Decoder(preset("test-tiny-vocab").replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
  exact, rounded = _sampled(half, f32, ids, s), _sampled(half, bf16, ids, s)
  assert rounded.output_ids == exact.output_ids and rounded.output_logprobs == exact.output_logprobs
  r = _sampled(model, bf16, ids, s)
  gap = np.abs(np.asarray(r.output_logprobs) - learner_logprobs(model, ids, r.output_ids, 1.0))
  assert 1e-6 < gap.max() < 0.05


@pytest.mark.parametrize("name", ["h200:1x1x1", "v5e:2x2"])
def test_decode_and_prefill_compile(model, name):
  pytest.importorskip("libtpu" if name.startswith("v5") else "jax_plugins.xla_cuda12",
                      reason="compiling for TPU / GPU needs the tpu / gpu-aot extra")
  devices = topology.devices(topology.parse(name))
  runner = KVRunner(model, dataclasses.replace(SMALL, devices=len(devices)), devices)
  assert runner.cache_dtype == jnp.bfloat16
  host = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=runner._replicated),
                                   tree)  # pylint: disable=protected-access
  key, params = np.zeros(2, np.uint32), SamplingParams(max_new_tokens=64, stop_token_ids=(7,))
  rows, cache_len = runner.decode_batch([DecodeRow(0, 5, 40, key, 1, 63, params), DecodeRow(1, 9, 20, key, 1, 8, params)],
                                        steps=8)
  decode = kv_forward._decode_program.lower(  # pylint: disable=protected-access
      runner.programs, runner.abstract_weights(), runner.abstract_cache(), host(rows), cache_len=cache_len,
      steps=8, truncate=False).compile()
  chunks = [PrefillChunk(0, np.arange(30), 0, key, params), PrefillChunk(1, np.arange(64), 64, key, params)]
  rows, cache_len = runner.prefill_batch(chunks)
  prefill = kv_forward._prefill_program.lower(  # pylint: disable=protected-access
      runner.programs, runner.abstract_weights(), runner.abstract_cache(), host(rows), cache_len=cache_len,
      truncate=False).compile()
  # The cache is updated in place (its buffers aliased to the outputs): never a second copy of it.
  shard_bytes = np.prod(runner.programs.cache_sharding.shard_shape(runner.cache_shape)) * 2
  for compiled in (decode, prefill):
    assert compiled.memory_analysis().alias_size_in_bytes == 2 * shard_bytes
