"""Zero padding of a grouped matmul's operands up to a kernel's tile multiples."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def pad(x: jax.Array, multiples: tuple[int, ...]) -> jax.Array:
  """x with zeros after each dim up to its multiple (unchanged where it already is one)."""
  widths = [(0, -d % m) for d, m in zip(x.shape, multiples)]
  return jnp.pad(x, widths) if any(w for _, w in widths) else x
