"""value.two_pass: a separate critic's gradient taken after the policy's backward (from a second forward
of its trunk) equals the joint backward's, and the compiled step no longer holds both trunks' saved
activations at once."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from clawjax import sharding
from clawjax.aot import topology
from clawjax.aot.spec import StepSpec
from clawjax.aot.step import compile_step
from clawjax.models.model import Decoder
from clawjax.rl.config import LearnerConfig, ValueConfig
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from tests.models.test_remat_layers import WIDE as REMAT_WIDE
from tests.rl.learner_batches import TINY, random_tree, rel_diff, tree_layout


def _learner(two_pass: bool) -> Learner:
  critic = make_value_model("separate", TINY.d_model, trunk=Decoder(TINY, rngs=nnx.Rngs(7)))
  cfg = LearnerConfig(loss="ppo", lr=1e-3, logits_chunk=32, micro_batches=2,
                      value=ValueConfig(kind="separate", two_pass=two_pass))
  learner = Learner(cfg, Decoder(TINY, rngs=nnx.Rngs(0)), value=critic)
  # The head starts at zero, which would leave the critic's trunk without a gradient.
  learner.state.params["value"]["head"]["kernel"].value = jnp.linspace(-1.0, 1.0, TINY.d_model)
  return learner


def test_two_pass_gives_the_joint_gradients_and_step():
  rng = np.random.default_rng(3)
  batch = tree_layout([random_tree(rng, 40, TINY.vocab_size) for _ in range(4)], rows=4, length=96)
  joint, two_pass = _learner(False), _learner(True)
  loss_j, grads_j, m_j = joint.loss_and_grads(batch)
  loss_t, grads_t, m_t = two_pass.loss_and_grads(batch)
  assert loss_t == pytest.approx(loss_j, rel=1e-6)
  assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_j["value"]["trunk"])) > 0
  for name in ("policy", "value"):
    assert rel_diff(grads_t[name], grads_j[name]) < 1e-5, name
  assert m_t["value_loss"] == pytest.approx(m_j["value_loss"], rel=1e-6)
  joint.step(batch)
  two_pass.step(batch)
  assert rel_diff(jax.device_get(two_pass.state.params), jax.device_get(joint.state.params)) < 1e-5


# Remat'd layers wide enough that their saved inputs are a large part of the step's temporaries.
WIDE = REMAT_WIDE.replace(n_layers=4, vocab_size=256, dtype="bfloat16", attention_block=1024)
ROW_LEN = 4096


@pytest.mark.slow
# The suite's compilation cache (tests/conftest.py) stores a compile-only TPU executable but cannot load it
# back (there is no TPU client): the pi_old pass, the same in both steps, is compiled again, with a warning.
@pytest.mark.filterwarnings("ignore:Error reading persistent compilation cache entry")
def test_two_pass_step_holds_one_trunks_saved_activations():
  """Compiled for v5e:2x2 (fsdp 4, a row per device): the CPU compiler's schedule is not the one that
  matters, and it keeps both trunks' activations either way."""
  pytest.importorskip("libtpu", reason="compiling for TPU needs the tpu extra (pip install '.[tpu]')")
  mesh_cfg = sharding.MeshConfig(data=1, fsdp=-1)
  mesh = sharding.make_mesh(mesh_cfg, topology.devices(topology.parse("v5e:2x2")))
  temps = {}
  for two_pass in (False, True):
    learner = LearnerConfig(loss="ppo", logits_chunk=256, value=ValueConfig(kind="separate", two_pass=two_pass))
    spec = StepSpec(model=WIDE, model_name="wide", mesh=mesh_cfg, learner=learner, rows=4, row_len=ROW_LEN,
                    topology=None)
    temps[two_pass] = compile_step(spec, mesh, WIDE.n_layers).temp_bytes
  trunk_saved = WIDE.n_layers * ROW_LEN * WIDE.d_model * jnp.dtype(WIDE.dtype).itemsize  # a row per device
  assert temps[False] - temps[True] > trunk_saved, {k: v / 2**20 for k, v in temps.items()}


def test_two_pass_needs_a_separate_critic():
  with pytest.raises(ValueError, match="two_pass needs value.kind='separate'"):
    LearnerConfig(loss="ppo", value=ValueConfig(kind="shared", two_pass=True))
