"""Small building blocks of the decoder: parameters with logical axes, RMSNorm, RoPE, SwiGLU MLP, and the
float32-output matmul of the vocab projection and attention scores (`einsum_f32`, defined with the kernels
in clawjax/kernels/precision.py, which the engine reaches through here).

Every parameter carries NNX `out_sharding` metadata with *logical* axis names ("vocab", "embed", "mlp",
"heads", "kv_heads", "head_dim", "expert"); clawjax/sharding.py maps them to mesh axes. Eager sharding is
off, so a model builds without a mesh; a learner shards with `clawjax.sharding.state_shardings`.
Activations are annotated with `constrain` ("batch", "length" and the parameters' names).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd

from clawjax.kernels.precision import einsum_f32  # pylint: disable=unused-import
from clawjax.models.config import ModelConfig
from clawjax.sharding import logical_to_mesh

LogicalAxes = Sequence[str | None]


def param(rngs: nnx.Rngs, shape: Sequence[int], axes: LogicalAxes, dtype: str, *, fan_in: int | None = None,
          init: str = "normal") -> nnx.Param:
  """A parameter named by logical axes: "normal" is N(0, 1/fan_in) (HF-like scale), "ones" for norms."""
  if len(axes) != len(shape):
    raise ValueError(f"param: {len(axes)} axis names {tuple(axes)} for shape {tuple(shape)}")
  if init == "ones":
    value = jnp.ones(shape, dtype)
  else:
    value = (jax.random.normal(rngs.params(), shape, jnp.float32) * (fan_in or shape[0]) ** -0.5).astype(dtype)
  return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def constrain(x: jax.Array, axes: LogicalAxes) -> jax.Array:
  """Logical sharding constraint on an activation; a no-op unless logical axis rules
  (`flax.core.spmd.logical_axis_rules`) and a mesh are both active while tracing, as under
  `clawjax.sharding.under_mesh`. Names map to mesh axes exactly as parameters' do
  (`sharding.logical_to_mesh`), so an axis that does not divide a dimension leaves it replicated.
  """
  rules = spmd.get_logical_axis_rules()
  mesh = jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_mesh(axes, x.shape, mesh, rules))


class RMSNorm(nnx.Module):
  """HF RMSNorm: normalise in float32, cast back to the input dtype, then scale."""

  def __init__(self, dim: int, eps: float, param_dtype: str, axes: LogicalAxes, *, rngs: nnx.Rngs):
    self.eps = eps
    self.scale = param(rngs, (dim,), axes, param_dtype, init="ones")

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale[...].astype(x.dtype) * normed.astype(x.dtype)


def apply_rope(x_BTNH: jax.Array, positions_BT: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding in the HF "rotate half" layout, angles computed in float32 at `positions`."""
  head_dim = x_BTNH.shape[-1]
  inv_freq_F = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
  angles_BTF = positions_BT.astype(jnp.float32)[..., None] * inv_freq_F
  cos_BT1H = jnp.cos(jnp.concatenate([angles_BTF, angles_BTF], -1))[:, :, None, :]
  sin_BT1H = jnp.sin(jnp.concatenate([angles_BTF, angles_BTF], -1))[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return (x_BTNH * cos_BT1H + rotated * sin_BT1H).astype(x_BTNH.dtype)


class MLP(nnx.Module):
  """SwiGLU MLP: down(silu(gate(x)) * up(x)); callable on [B, T, D]."""

  def __init__(self, cfg: ModelConfig, mlp_dim: int, *, rngs: nnx.Rngs):
    self.dtype = cfg.dtype
    d = cfg.d_model
    self.gate = param(rngs, (d, mlp_dim), ("embed", "mlp"), cfg.param_dtype)
    self.up = param(rngs, (d, mlp_dim), ("embed", "mlp"), cfg.param_dtype)
    self.down = param(rngs, (mlp_dim, d), ("mlp", "embed"), cfg.param_dtype)

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    x_BTD = x_BTD.astype(self.dtype)
    gate_BTF = x_BTD @ self.gate[...].astype(self.dtype)
    up_BTF = x_BTD @ self.up[...].astype(self.dtype)
    h_BTF = constrain(jax.nn.silu(gate_BTF) * up_BTF, ("batch", "length", "mlp"))
    return h_BTF @ self.down[...].astype(self.dtype)
