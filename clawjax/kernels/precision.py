"""The float32-output matmul of attention scores and the vocab projection, with mixed-precision gradients:
the one matmul primitive the kernels' references and the model share."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)` accumulated and returned in float32 (logits and attention scores need it),
  whose backward multiplies in the inputs' dtype, as mixed-precision training does: with
  `preferred_element_type=float32` alone, the float32 cotangent would make both gradient matmuls float32
  (bf16 inputs converted up), which on a GPU runs at half the bf16 rate with twice the bytes: the vocab
  projection's weight and input gradients, and the attention backward's dQ and dK. Here the cotangent is
  rounded to the inputs' dtype first; the gradient matmuls accumulate in float32 inside and return that
  dtype. With float32 inputs it is the plain einsum, gradients included."""
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _einsum_f32_fwd(spec: str, a: jax.Array, b: jax.Array):
  return einsum_f32(spec, a, b), (a, b)


def _einsum_f32_bwd(spec: str, residuals, g: jax.Array):
  a, b = residuals
  _, vjp = jax.vjp(functools.partial(jnp.einsum, spec), a, b)
  return vjp(g.astype(jnp.result_type(a, b)))


einsum_f32.defvjp(_einsum_f32_fwd, _einsum_f32_bwd)
