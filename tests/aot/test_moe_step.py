"""A Qwen3-MoE learner step on grouped matmuls, compiled from this host for a TPU and a Hopper GPU: on TPU,
XLA's FLOPs are within 1.3 x of clawjax/aot/flops.py's count and not below it (megablox's kernels carry
their cost; XLA's own ragged dot computes its weight gradient densely over every expert); on GPU the
step's temporaries stay below one dense tokens x experts x MLP array, which XLA's ragged dot forms."""
from __future__ import annotations

import pytest

from clawjax import sharding
from clawjax.aot import flops
from clawjax.aot.spec import StepSpec
from clawjax.aot.step import compile_step
from clawjax.models.config import PRESETS
from clawjax.rl.config import LearnerConfig
from tests.aot import devices_or_skip

# The experts dominate the step (128 of them, top 2, MLP 256 wide on a 128-wide model, short rows); dense
# attention scores every (query, key) pair, a causal row's twice, as in tests/aot/test_flops.py.
MODEL = PRESETS["test-tiny-moe"].replace(d_model=128, n_heads=2, n_kv_heads=1, head_dim=64, n_experts=128,
                                         top_k=2, moe_mlp_dim=256, n_layers=1, dtype="bfloat16",
                                         attention_impl="dense")
ROWS, ROW_LEN = 64, 64
LEARNER = LearnerConfig(micro_batches=1, logits_chunk=ROW_LEN)


def _compile(slice_name: str):
  spec = StepSpec(model=MODEL, model_name="m", mesh=sharding.MeshConfig(data=1), learner=LEARNER, rows=ROWS,
                  row_len=ROW_LEN, topology=None)
  return compile_step(spec, sharding.make_mesh(spec.mesh, devices_or_skip(slice_name)[:1]), MODEL.n_layers)


@pytest.mark.slow
def test_tpu_step_flops_match_the_count():
  xla = _compile("v5p:2x2x1").compiler_flops
  counted = flops.step_count(MODEL, LEARNER, rows=ROWS, row_len=ROW_LEN, loss_slots=ROW_LEN, devices=1,
                             weight_shards=1).flops
  half = 4 * MODEL.n_heads * MODEL.head_dim * (ROW_LEN - 1) / 2 * MODEL.n_layers * ROWS * ROW_LEN
  assert 1.0 <= xla / (counted + 4 * half) <= 1.3, (xla, counted)  # pi_old, forward + backward (x3)


@pytest.mark.slow
def test_gpu_step_forms_no_dense_expert_array():
  dense_bytes = ROWS * ROW_LEN * MODEL.n_experts * MODEL.moe_mlp_dim * 2  # bfloat16
  temp = _compile("h200:1x1x1").temp_bytes
  assert temp < dense_bytes, (temp, dense_bytes)
