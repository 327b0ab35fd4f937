"""The PPO critic V(s_t): a linear head on the policy trunk ("shared") or on its own trunk ("separate").

The value of the state before token t is read from the hidden state that predicts t (its parent), so the
critic sees exactly the context the policy saw when it sampled a_t, branch by branch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from clawjax.models.routing import Replay
from clawjax.rl.logprobs import gather_rows


class ValueHead(nnx.Module):
  """h -> scalar. Zero-initialised so V starts at 0 and the first advantages are the raw returns."""

  def __init__(self, d_model: int):
    self.kernel = nnx.Param(jnp.zeros((d_model,), jnp.float32), out_sharding=("embed",), eager_sharding=False)
    self.bias = nnx.Param(jnp.zeros((), jnp.float32))

  def __call__(self, hidden_RKD: jax.Array) -> jax.Array:
    return hidden_RKD.astype(jnp.float32) @ self.kernel.value + self.bias.value


class SeparateValue(nnx.Module):
  """A critic with its own decoder trunk (any module with the Decoder's `hidden` method)."""

  def __init__(self, trunk: nnx.Module, d_model: int):
    self.trunk = trunk
    self.head = ValueHead(d_model)


def make_value_model(kind: str, d_model: int, trunk: nnx.Module | None = None) -> nnx.Module | None:
  """The value module of a ValueConfig.kind; "separate" needs the critic's trunk."""
  if kind == "none":
    return None
  if kind == "shared":
    return ValueHead(d_model)
  if trunk is None:
    raise ValueError("ValueConfig.kind='separate' needs a trunk model (e.g. a second Decoder)")
  return SeparateValue(trunk, d_model)


def values_at(value_model: nnx.Module, policy_hidden_RKD: jax.Array, tokens_RT: jax.Array,
              positions_RT: jax.Array, segment_ids_RT: jax.Array, subtree_end_RT: jax.Array,
              pred_index_RK: jax.Array, replay: Replay | None = None) -> jax.Array:
  """V(s_t) for each loss slot, [R, K]; `replay`: a MoE critic trunk routes as the policy replays."""
  if isinstance(value_model, SeparateValue):
    if replay is None:
      hidden = value_model.trunk.hidden(tokens_RT, positions_RT, segment_ids_RT, subtree_end_RT)
    else:
      hidden = value_model.trunk.hidden(tokens_RT, positions_RT, segment_ids_RT, subtree_end_RT, replay)
    return value_model.head(gather_rows(hidden, pred_index_RK))
  return value_model(policy_hidden_RKD)
