"""The learner's real update step for a StepSpec, built from abstract parameters and compiled for a slice.

The policy (and critic) come from `nnx.eval_shape`: no weights are read or allocated. The Learner is
built on them in its abstract mode, on a mesh of the slice's compile-only devices, and its jitted step
(`Learner._train`, what `Learner.step` runs after the step's pi_old pass `Learner._old`) is lowered with the
config's packed batch shapes. The pi_old pass is a program of its own (forward passes only); a device's peak
is the larger of the two programs' temporaries.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
from flax import nnx

from clawjax import sharding
from clawjax.aot import lowering, topology
from clawjax.aot.spec import StepSpec
from clawjax.models.config import ModelConfig
from clawjax.models.model import Decoder
from clawjax.rl.device_batch import DeviceBatch, RouteLayout
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model

_ROW_FIELDS = ("tokens", "positions", "segment_ids", "subtree_end")
_INT_SLOT_FIELDS = ("pred_index", "targets", "rollout")


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  rows: int        # rows the step runs: the config's, padded to a multiple of micro-batches x row shards
  row_len: int
  loss_slots: int  # K per row: the most a row can need (every token a loss token), in logits chunks


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  layers: int
  argument_bytes: int  # per device
  output_bytes: int
  alias_bytes: int     # outputs that reuse donated arguments (the train state)
  temp_bytes: int
  compiler_flops: float | None  # XLA's count per device, both programs (loop bodies once); None where it gives none
  attention_lowering: str | None  # clawjax/aot/lowering.py, both programs; None when the compiler refused the step
  moe_lowering: str | None        # the same for the MoE's experts; also None without MoE layers
  refused: bool = False         # the TPU compiler stopped at its HBM check: temp_bytes is what it asked for
  routes_bytes: int = 0         # per device: the batch's replayed routes (ids and flags), within argument_bytes


def batch_layout(spec: StepSpec, mesh: jax.sharding.Mesh) -> BatchLayout:
  step = spec.learner.micro_batches * sharding.batch_shards(mesh)
  chunk = spec.learner.logits_chunk
  return BatchLayout(rows=-(-spec.rows // step) * step, row_len=spec.row_len,
                     loss_slots=-(-spec.row_len // chunk) * chunk)


def route_layout(learner: Learner) -> RouteLayout | None:
  """The routes a replaying step's batches carry (uint8 ids while n_experts <= 256), or None."""
  if not learner.replay.on:
    return None
  return learner.replay.layout(1 if learner.replay.cfg.n_experts <= 256 else 2)


def _abstract_batch(layout: BatchLayout, micro: int, placed: DeviceBatch,
                    routes: RouteLayout | None = None) -> DeviceBatch:
  def one(name: str) -> jax.ShapeDtypeStruct | None:
    rows = (micro, layout.rows // micro)
    if name == "row_order":  # [M, r]: a row's place in the global order
      return jax.ShapeDtypeStruct(rows, jnp.int32, sharding=getattr(placed, name))
    if name in ("routes", "routed"):  # [M, r, T, moe_layers, top_k] ids and [M, r, T] flags, when replaying
      if routes is None:
        return None
      moe_layers, top_k, nbytes = routes
      shape, dtype = ((*rows, layout.row_len, moe_layers, top_k), {1: jnp.uint8, 2: jnp.uint16}[nbytes]) \
          if name == "routes" else ((*rows, layout.row_len), jnp.bool_)
      return jax.ShapeDtypeStruct(shape, dtype, sharding=getattr(placed, name))
    width = layout.row_len if name in _ROW_FIELDS else layout.loss_slots
    dtype = jnp.int32 if name in _ROW_FIELDS + _INT_SLOT_FIELDS else jnp.float32
    return jax.ShapeDtypeStruct((*rows, width), dtype, sharding=getattr(placed, name))

  return DeviceBatch(**{f.name: one(f.name) for f in dataclasses.fields(DeviceBatch)})


def abstract_learner(spec: StepSpec, model: ModelConfig, mesh: jax.sharding.Mesh) -> Learner:
  """A Learner over shapes only: the policy, and the critic the config asks for."""
  decoder = lambda: Decoder(model, rngs=nnx.Rngs(0))
  policy = nnx.eval_shape(decoder)
  kind = spec.learner.value.kind
  value = None
  if kind != "none":
    value = nnx.eval_shape(lambda: make_value_model(kind, model.d_model, decoder() if kind == "separate" else None))
  return Learner(spec.learner, policy, value=value, mesh=mesh, abstract=True)


# libtpu's message when a program's temporaries exceed the chip's HBM (it compiles no further).
_TPU_OOM = re.compile(r"RESOURCE_EXHAUSTED: .*HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}


def per_device_bytes(tree: object) -> int:
  """Bytes one device holds of a tree of placed ShapeDtypeStructs (its shard of each)."""
  leaves = jax.tree.leaves(tree)
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in leaves)


def compile_step(spec: StepSpec, mesh: jax.sharding.Mesh, layers: int) -> CompiledStep:
  """Compiles the step of `spec`'s model cut to `layers` layers for `mesh`'s devices."""
  learner = abstract_learner(spec, spec.model.replace(n_layers=layers), mesh)
  routes = route_layout(learner)
  placed = learner.batch_sharding if routes else dataclasses.replace(learner.batch_sharding, routes=None, routed=None)
  batch = _abstract_batch(batch_layout(spec, mesh), spec.learner.micro_batches, placed, routes)
  try:
    with topology.lowering_for(mesh.devices.flat[0]):
      old_compiled = learner._old.lower(learner.state, batch, learner.rest).compile()
      old = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         jax.eval_shape(learner._old, learner.state, batch, learner.rest),
                         old_compiled.output_shardings)
      compiled = learner._train.lower(learner.state, batch, learner.rest, old).compile()
  except jax.errors.JaxRuntimeError as e:
    oom = _TPU_OOM.search(str(e))
    if not oom:
      raise
    state = per_device_bytes(learner.state)
    return CompiledStep(layers=layers, argument_bytes=state + per_device_bytes((batch, learner.rest)),
                        output_bytes=state, alias_bytes=state,
                        temp_bytes=int(float(oom.group(1)) * _UNITS[oom.group(2)]), compiler_flops=None,
                        attention_lowering=None, moe_lowering=None, refused=True,
                        routes_bytes=per_device_bytes((batch.routes, batch.routed)))
  memory = compiled.memory_analysis()
  costs = [c.cost_analysis() for c in (old_compiled, compiled)]
  hlo = [c.as_text() for c in (old_compiled, compiled)]
  return CompiledStep(layers=layers, argument_bytes=memory.argument_size_in_bytes,
                      output_bytes=memory.output_size_in_bytes, alias_bytes=memory.alias_size_in_bytes,
                      temp_bytes=max(memory.temp_size_in_bytes, old_compiled.memory_analysis().temp_size_in_bytes),
                      compiler_flops=sum(float(c["flops"]) for c in costs)
                      if all(c and "flops" in c for c in costs) else None,
                      attention_lowering=lowering.attention_lowering(hlo), moe_lowering=lowering.moe_lowering(hlo),
                      routes_bytes=per_device_bytes((batch.routes, batch.routed)))
