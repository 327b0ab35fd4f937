"""remat=True in the learner's jitted step: it lowers (the pi_old pass maps the model over micro-batches)
and gives remat=False's step, for a dense and a MoE policy, whichever checkpoint policy is chosen."""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

from clawjax.models.config import PRESETS, ModelConfig
from clawjax.models.model import Decoder
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from tests.rl.learner_batches import TINY, random_tree, rel_diff, tree_layout

TINY_MOE = PRESETS["test-tiny-moe"].replace(n_layers=1, vocab_size=256)
# adamw with clipping: the whole update path (moments, clip) runs under remat too.
CFG = LearnerConfig(lr=1e-3, logits_chunk=32, micro_batches=2)


def _batch():
  rng = np.random.default_rng(0)
  return tree_layout([random_tree(rng, 40, TINY.vocab_size) for _ in range(4)], rows=4, length=96)


@pytest.mark.parametrize("model_cfg, policy", [(TINY, "nothing_saveable"), (TINY_MOE, "nothing_saveable"),
                                               (TINY, "dots_with_no_batch_dims_saveable")],
                         ids=["dense", "moe", "dense-save-dots"])
def test_remat_step_equals_plain_step(model_cfg: ModelConfig, policy: str):
  batch = _batch()
  plain = Learner(CFG, Decoder(model_cfg, rngs=nnx.Rngs(0)))
  remat = Learner(CFG, Decoder(model_cfg.replace(remat=True, remat_policy=policy), rngs=nnx.Rngs(0)))
  m_plain, m_remat = plain.step(batch), remat.step(batch)
  for key in ("loss", "grad_norm"):
    assert m_remat[key] == pytest.approx(m_plain[key], rel=1e-5), key
  assert rel_diff(jax.device_get(remat.state.params), jax.device_get(plain.state.params)) < 1e-5


def test_unknown_remat_policy_is_named():
  with pytest.raises(ValueError, match="remat_policy"):
    TINY.replace(remat_policy="save_only_these_names")


@pytest.mark.slow
def test_remat_step_with_a_sharded_moe_equals_the_single_device_step():
  """remat around the MoE block's per-shard computation (fsdp, tensor and expert all split)."""
  from clawjax import sharding
  from tests.rl.test_activation_sharding import CFG as SGD, _assert_step_matches_single_device, _batch as batch

  mesh = sharding.make_mesh(sharding.MeshConfig(data=1, fsdp=2, tensor=2, expert=2))
  make = lambda: Decoder(TINY_MOE.replace(remat=True), rngs=nnx.Rngs(0))
  _assert_step_matches_single_device(SGD, make, mesh, batch(1))
