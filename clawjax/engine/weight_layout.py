"""The engine's one-row copy of a Decoder's weights: each dense Linear as one [outputs, inputs] matrix (the
HF / PyTorch layout).

A request decoding alone multiplies one row by every weight matrix: matrix-vector products, bound by
reading the weights. XLA's CPU backend runs them faster over a matrix contracted along its minor
(contiguous) axis than along its major axis, which is the model's [inputs..., outputs...] layout; with 2
to 32 rows it is the other way round (SmolLM2-135M's 30 layers of projections, 2 CPU cores: one row 12.8
-> 11.1 ms, two rows 12.7 -> 19.1, 16 rows 18.7 -> 25.0; equal at 64). So the engine keeps the model's
layout for every dispatch and, where `EngineConfig.one_row_copy` is on, this copy for dispatches of one
row.

Which params are Linears, and how many of their leading axes are inputs, is the HF export's table
(`hf_io.linear_input_dims`). A MoE layer's router and experts have no copy: the MoE module reads them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from clawjax.models.config import ModelConfig
from clawjax.models.hf_io import linear_input_dims
from clawjax.sharding import key_name


def input_dims(cfg: ModelConfig, paths: Sequence[tuple[Any, ...]]) -> list[int]:
  """Per leaf of a Decoder state (its key paths, in order): how many leading input axes the engine folds
  into the columns of an [outputs, inputs] matrix; 0 for a param kept as it is."""
  linears = {path: n for path, n in linear_input_dims(cfg).items() if path[-1] != "router"}
  names = [tuple(key_name(k) for k in path) for path in paths]
  # A state leaf's path ends in its Variable's "value".
  return [linears.get(name[:-1] if name[-1] == "value" else name, 0) for name in names]


def engine_shape(shape: Sequence[int], in_dims: int) -> tuple[int, int]:
  """The [outputs, inputs] shape of a Linear whose leading `in_dims` axes are its inputs (`hf_layout`'s)."""
  return math.prod(shape[in_dims:]), math.prod(shape[:in_dims])


def engine_sharding(sharding: NamedSharding, ndim: int, in_dims: int) -> NamedSharding:
  """The model layout's sharding carried to the engine's: a group of axes folded into one keeps the mesh
  axis of its leading member (e.g. "heads" of (heads, head_dim)), so every device keeps the same rows."""
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))

  def folded(group: tuple[Any, ...]) -> Any:
    if any(axis is not None for axis in group[1:]):
      raise ValueError(f"the engine cannot fold a weight sharded as {sharding.spec} into one matrix")
    return group[0]

  return NamedSharding(sharding.mesh, P(folded(spec[in_dims:]), folded(spec[:in_dims])))


def linear(x_BTI: jax.Array, w_OI: jax.Array, dtype: Any) -> jax.Array:
  """x @ w.T for an engine-layout weight, in `dtype`."""
  return jax.lax.dot_general(x_BTI.astype(dtype), w_OI.astype(dtype), (((x_BTI.ndim - 1,), (1,)), ((), ())))
