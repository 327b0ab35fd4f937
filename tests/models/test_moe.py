"""The MoE block's experts against float64 brute force (a loop over the experts), output and every gradient,
with all experts held and with a shard of them (as under expert parallelism, where the other experts'
(token, choice) pairs trail outside every group), through a `lax.ragged_dot` that writes NaN into the rows
outside its groups, in its output and in its input gradient, as a kernel may: nothing of it may leak."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from clawjax.models.config import PRESETS
from clawjax.models.moe import experts_output
from tests.models.helpers import garbage_ragged_dot

CFG = PRESETS["test-tiny-moe"]  # 8 experts, top 2, d_model 64, moe_mlp_dim 32, float32


def _brute_force(x_ND, router_DE, gate_EDF, up_EDF, down_EFD, dy_ND, first: int):
  """sum over the choices of weight x expert MLP(x) in float64, one expert at a time over every token,
  counting the held experts first .. first + len(gate) - 1; with its gradients for the loss sum(y * dy)."""

  def block(x_ND, router_DE, gate_EDF, up_EDF, down_EFD):
    probs_NE = jax.nn.softmax(x_ND @ router_DE, axis=-1)
    weights_NK, experts_NK = jax.lax.top_k(probs_NE, CFG.top_k)
    weights_NK = weights_NK / jnp.sum(weights_NK, axis=-1, keepdims=True)
    y_ND = jnp.zeros_like(x_ND)
    for i in range(gate_EDF.shape[0]):
      mlp_ND = (jax.nn.silu(x_ND @ gate_EDF[i]) * (x_ND @ up_EDF[i])) @ down_EFD[i]
      y_ND += jnp.sum(jnp.where(experts_NK == first + i, weights_NK, 0), axis=1)[:, None] * mlp_ND
    return y_ND

  with jax.enable_x64(True):
    args = [jnp.asarray(a, jnp.float64) for a in (x_ND, router_DE, gate_EDF, up_EDF, down_EFD)]
    y_ND, vjp = jax.vjp(block, *args)
    return [np.asarray(a) for a in (y_ND, *vjp(jnp.asarray(dy_ND, jnp.float64)))]


@pytest.mark.parametrize("first, held", [(0, 8), (3, 2)], ids=["all-experts", "expert-shard"])
def test_experts_equal_float64_brute_force_whatever_ragged_dot_leaves_outside_its_groups(monkeypatch, first, held):
  monkeypatch.setattr(jax.lax, "ragged_dot", garbage_ragged_dot)
  keys = jax.random.split(jax.random.key(0), 6)
  n, d, e, f = 24, CFG.d_model, CFG.n_experts, CFG.moe_mlp_dim
  x_ND = jax.random.normal(keys[0], (n, d))
  router_DE = jax.random.normal(keys[1], (d, e))
  gate_EDF, up_EDF = (jax.random.normal(k, (held, d, f)) * d ** -0.5 for k in keys[2:4])
  down_EFD = jax.random.normal(keys[4], (held, f, d)) * f ** -0.5
  dy_ND = jax.random.normal(keys[5], (n, d))
  weights = (router_DE, gate_EDF, up_EDF, down_EFD)

  def run(x_ND, *weights):
    y_ND, vjp = jax.vjp(lambda *a: experts_output(*a, CFG, first), x_ND, *weights)
    return (y_ND, *vjp(dy_ND))

  got = jax.jit(run)(x_ND, *weights)
  expected = _brute_force(x_ND, *weights, dy_ND, first)
  # The output, then the gradients of the tokens, the router and each expert matrix.
  for name, a, b in zip(("y", "dx", "drouter", "dgate", "dup", "ddown"), got, expected):
    np.testing.assert_allclose(a, b, rtol=0, atol=2e-5 * np.max(np.abs(b)), err_msg=name)
