"""Which lowering the attention got, read from compiled programs (clawjax/aot/lowering.py): per kernel and
platform (CPU, a TPU slice, an H200, compile-only from this host), and in compile.py's report of a
learner step with `attention_impl="pallas"` compiled for an H200."""
import functools

import jax
import jax.numpy as jnp
import pytest

from clawjax import sharding
from clawjax.aot import lowering, topology
from clawjax.aot.report import compile_report
from clawjax.aot.spec import StepSpec
from clawjax.config import ConfigError
from clawjax.kernels import tree_attention as attention
from clawjax.models.config import PRESETS
from clawjax.rl.config import LearnerConfig


def _device(target: str) -> jax.Device:
  if target == "cpu":
    return jax.devices("cpu")[0]
  try:
    return topology.devices(topology.parse(target))[0]
  except ConfigError as e:  # no libtpu (the tpu extra) or no CUDA plugin (the gpu-aot extra)
    pytest.skip(str(e))


@pytest.mark.parametrize("target, impl, expected", [
    ("cpu", "dense", "xla"), ("cpu", "blocked", "xla"), ("cpu", "pallas", "interpret"),
    ("v5e:2x2", "pallas", "mosaic_tpu"), ("h200:1x1x1", "pallas", "triton"), ("h200:1x1x1", "blocked", "xla")])
def test_lowering_of_each_kernel_per_platform(target, impl, expected):
  device = _device(target)
  one = jax.sharding.SingleDeviceSharding(device)
  b, t, n, kv, h = 1, 256, 2, 1, 128
  args = (jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16, sharding=one),
          *[jax.ShapeDtypeStruct((b, t, kv, h), jnp.bfloat16, sharding=one)] * 2,
          *[jax.ShapeDtypeStruct((b, t), jnp.int32, sharding=one)] * 2)
  kernel = functools.partial(attention.KERNELS[impl], block=128)
  loss = lambda *a: jnp.sum(kernel(*a).astype(jnp.float32))
  with topology.lowering_for(device):
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*args).compile()
  assert lowering.attention_lowering([compiled.as_text()]) == expected


@pytest.mark.slow
def test_report_of_a_pallas_step_compiled_for_h200():
  """The learner's step (pi_old pass and update) of a tiny Qwen3 with the paper's attention setting,
  compiled for one H200: the report reads the Triton kernels from the compiled programs."""
  _device("h200:1x1x1")
  model = PRESETS["test-tiny-vocab"].replace(attention_impl="pallas", dtype="bfloat16", remat=True, n_layers=1)
  spec = StepSpec(model=model, model_name="test-tiny-vocab", mesh=sharding.MeshConfig(data=1),
                  learner=LearnerConfig(logits_chunk=128), rows=1, row_len=128, topology=None)
  report = compile_report(spec, "h200:1x1x1")
  assert report.attention_impl == "pallas" and report.attention_lowering == "triton"
  assert report.as_json()["attention_lowering"] == "triton" and "(lowered: triton)" in report.text()
