"""The step's FLOPs counted from shapes (clawjax/aot/flops.py) against XLA's own count of the compiled step
on CPU. Every loop of the step runs once here (one micro-batch, one logits chunk, one update), so XLA's
count, which sees a loop body once, is the whole step: the pi_old pass, forward and backward, the
logits chunk's recompute, a separate critic's trunk and its second forward under `value.two_pass`."""
from __future__ import annotations

import jax
import pytest

from clawjax import sharding
from clawjax.aot import flops
from clawjax.aot.spec import StepSpec
from clawjax.aot.step import compile_step
from clawjax.models.config import PRESETS
from clawjax.rl.config import LearnerConfig, ValueConfig

# Matmuls dominate (XLA also counts norms, softmax and the optimizer's elementwise work, which the
# analytical count leaves out). Dense attention scores every (query, key) pair, a causal row's twice.
MODEL = PRESETS["test-tiny-vocab"].replace(d_model=256, n_heads=4, n_kv_heads=2, head_dim=64, mlp_dim=1024,
                                           vocab_size=512, n_layers=2, attention_impl="dense")
ROWS, ROW_LEN = 2, 256


@pytest.mark.parametrize("loss, value, two_pass", [("grpo", "none", False), ("ppo", "separate", False),
                                                   ("ppo", "separate", True)])
def test_counted_flops_match_xlas_count_of_the_compiled_step(loss, value, two_pass):
  learner = LearnerConfig(loss=loss, logits_chunk=ROW_LEN, value=ValueConfig(kind=value, two_pass=two_pass))
  spec = StepSpec(model=MODEL, model_name="m", mesh=sharding.MeshConfig(data=1), learner=learner, rows=ROWS,
                  row_len=ROW_LEN, topology=None)
  xla = compile_step(spec, sharding.make_mesh(spec.mesh, jax.devices()[:1]), MODEL.n_layers).compiler_flops
  counted = flops.step_count(MODEL, learner, rows=ROWS, row_len=ROW_LEN, loss_slots=ROW_LEN, devices=1,
                             weight_shards=1).flops
  # The other half of each score matrix, QK^T and PV, in every trunk pass the count makes of it.
  trunks = 2 if value == "separate" else 1
  passes = 4 * trunks + (1 if two_pass else 0)  # pi_old, forward + backward (x3), the second forward
  half = 4 * MODEL.n_heads * MODEL.head_dim * (ROW_LEN - 1) / 2 * MODEL.n_layers * ROWS * ROW_LEN
  assert 1.0 <= xla / (counted + passes * half) < 1.05, (xla, counted)
