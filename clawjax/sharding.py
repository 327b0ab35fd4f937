"""Device mesh and logical-axis rules: how params, optimizer state and batches are laid out.

The model annotates each parameter with logical axis names ("vocab", "embed", "mlp", "heads",
"kv_heads", "head_dim", "expert") and each activation (`layers.constrain`) with those plus "batch" and
"length"; the learner maps them onto four mesh axes:

  data    pure data parallelism: batch rows split, params replicated.
  fsdp    batch rows split *and* params split along "embed" (ZeRO-3 style: gathered per layer by XLA).
  tensor  Megatron-style model parallelism over "heads", "kv_heads", "mlp", "vocab".
  expert  MoE experts split along "expert".

A logical axis whose dimension is not divisible by its mesh axes' size is left replicated, so one set of
rules serves every preset from test-tiny to qwen3-30b-a3b (a dim of 64 heads on 3 tensor shards would
otherwise fail to lower).

Activation constraints are emitted only while a function traces under `under_mesh(fn, mesh, rules)`
(the learner's jitted steps do); elsewhere (the engine, eager calls) `layers.constrain` is a no-op and
XLA propagates the parameters' shardings alone.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx
from flax.core import spmd
from jax.experimental import mesh_utils
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from clawjax.config import ConfigError

MESH_AXES = ("data", "fsdp", "tensor", "expert")
DCN_GRANULES = ("slice", "process")
# Batch rows are split over every axis that does not split the model's math.
BATCH_AXES = ("data", "fsdp")

DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", BATCH_AXES),
    ("length", None),  # sequence parallelism would map it to a mesh axis
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("expert", "expert"),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh axis sizes; exactly one may be -1 (= all remaining devices). The product must equal the
  device count.

  On several slices (TPU multi-slice) or nodes (GPU hosts) the links between them are slower than those
  inside one: `dcn_data` and `dcn_fsdp` say over how many of these granules the data and fsdp axes are
  split (of their total sizes above); the mesh then comes from `mesh_utils.create_hybrid_device_mesh`,
  which keeps tensor and expert (and the rest of data and fsdp) inside a granule. With both at 1 the
  devices are laid out in `jax.devices()` order (one process's devices next to each other).

  `expert` > 1 (expert parallelism, a divisor of n_experts) splits an MoE model's experts over that many
  devices, which see the same rows (rows are split over data and fsdp only): each holds and FSDP-gathers
  only its experts' weights, runs the grouped matmuls on only its experts' (token, choice) pairs, and the
  group's outputs are summed (clawjax/models/moe.py). It costs an all-reduce of [tokens, d_model] per MoE
  layer (and one in the backward), and the rest of the model (attention) runs once on each device of the
  group. Set it when a device's tokens per micro-batch are too few to hide fsdp's per-layer gather of
  every expert's weights behind their compute. For Qwen3-30B-A3B on v5p, from the chips' figures (not
  measured): a layer's experts are 1.2 GB in bfloat16, ~2 ms at 600 GB/s of ICI, while a token's forward
  through them is 75 MFLOP, 2 ms for ~12K tokens at 459 TFLOP/s; so below ~10K tokens a device. The
  paper's configs, 64K tokens a device, keep 1. On a GPU the Mosaic forward kernels still visit every
  pair's row tile, so there it saves memory and gathers but not those FLOPs."""
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  expert: int = 1
  dcn_data: int = 1
  dcn_fsdp: int = 1
  dcn_granule: str = "slice"  # the granule: "slice" (a TPU slice, device.slice_index) or "process" (a host)

  def __post_init__(self):
    for name in ("dcn_data", "dcn_fsdp"):
      if getattr(self, name) < 1:
        raise ConfigError(f"config.mesh.{name}: {getattr(self, name)} must be >= 1")
    if self.dcn_granule not in DCN_GRANULES:
      raise ConfigError(f"config.mesh.dcn_granule: {self.dcn_granule!r} is not one of {DCN_GRANULES}")

  def shape(self, n_devices: int) -> tuple[int, ...]:
    sizes = [self.data, self.fsdp, self.tensor, self.expert]
    fill = [i for i, s in enumerate(sizes) if s == -1]
    if len(fill) > 1 or any(s == 0 or s < -1 for s in sizes):
      raise ValueError(f"MeshConfig {self}: sizes must be positive, at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if fill:
      if n_devices % known:
        raise ValueError(f"MeshConfig {self}: {n_devices} devices not divisible by {known}")
      sizes[fill[0]] = n_devices // known
    if math.prod(sizes) != n_devices:
      raise ValueError(f"MeshConfig {self}: product {math.prod(sizes)} != {n_devices} devices")
    for name, size, dcn in (("data", sizes[0], self.dcn_data), ("fsdp", sizes[1], self.dcn_fsdp)):
      if size % dcn:
        raise ValueError(f"MeshConfig {self}: {name} size {size} is not a multiple of dcn_{name}={dcn}")
    return tuple(sizes)

  def dcn_shape(self) -> tuple[int, ...]:
    """How many granules each mesh axis spans."""
    return (self.dcn_data, self.dcn_fsdp, 1, 1)


@dataclasses.dataclass(frozen=True)
class CompileTarget:
  """The `compile` section of a train or SFT config: what experiments/compile.py (clawjax/aot) compiles
  the learner step for; the run itself never reads it."""
  # The accelerator slice the config's mesh and batch are sized for ("v5p:4x4x4", "h200:1x1x8";
  # clawjax/aot/topology.py): experiments/compile.py's default --topology.
  topology: str | None = None
  # The architecture (a clawjax.models.config preset) compiled when model.init is a placeholder, as in the
  # paper configs, whose weights are a path given at launch.
  model: str | None = None


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A Mesh with axes MESH_AXES over `devices` (default: all, of every process)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = config.shape(len(devices))
  dcn = config.dcn_shape()
  if math.prod(dcn) == 1:
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)
  inner = tuple(size // d for size, d in zip(shape, dcn))
  grid = mesh_utils.create_hybrid_device_mesh(inner, dcn, devices, process_is_granule=config.dcn_granule == "process")
  return Mesh(grid, MESH_AXES)


def _as_tuple(axes: str | Sequence[str] | None) -> tuple[str, ...]:
  if axes is None:
    return ()
  return (axes,) if isinstance(axes, str) else tuple(axes)


def logical_to_mesh(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh | AbstractMesh,
                    rules: Sequence[tuple[str, Any]] = DEFAULT_RULES) -> P:
  """The mesh PartitionSpec of an array with the given logical axis names.

  An unknown logical name is an error (a typo would silently replicate a 30B model); a mesh axis that is
  absent from the mesh or of size 1, used by an earlier dimension (e.g. "batch" and "embed" both on
  "fsdp"), or that does not divide the dimension is dropped (replicated)."""
  rule_map = dict(rules)
  if len(logical) != len(shape):
    raise ValueError(f"logical axes {tuple(logical)} do not match shape {tuple(shape)}")
  used: set[str] = set()
  spec = []
  for name, dim in zip(logical, shape):
    if name is None:
      spec.append(None)
      continue
    if name not in rule_map:
      raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rule_map)}")
    axes = [a for a in _as_tuple(rule_map[name]) if a not in used and mesh.shape.get(a, 1) > 1]
    # Keep the longest prefix of mesh axes whose product divides the dimension.
    while axes and dim % math.prod(mesh.shape[a] for a in axes):
      axes.pop()
    used.update(axes)
    spec.append(tuple(axes) if len(axes) > 1 else (axes[0] if axes else None))
  return P(*spec)


def under_mesh(fn: Callable[..., Any], mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES
               ) -> Callable[..., Any]:
  """`fn` running with `mesh` (as the abstract mesh) and the logical `rules` active, so that tracing it
  emits the model's activation sharding constraints. Wrap *before* `jax.jit`: the contexts are entered
  inside the trace (`jax.set_mesh` may not be), so every retrace sees them too."""

  @functools.wraps(fn)
  def traced(*args: Any, **kwargs: Any) -> Any:
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), spmd.logical_axis_rules(rules):
      return fn(*args, **kwargs)

  return traced


def state_shardings(state: nnx.State, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]] = DEFAULT_RULES) -> nnx.State:
  """NamedShardings for an nnx.State (same structure), from the Variables' logical annotations."""
  logical = nnx.get_partition_spec(state)

  def one(spec: P, x: jax.Array) -> NamedSharding:
    return NamedSharding(mesh, logical_to_mesh(tuple(spec) or (None,) * x.ndim, x.shape, mesh, rules))

  return jax.tree.map(one, logical, state, is_leaf=lambda x: isinstance(x, P))


def optimizer_shardings(tx: optax.GradientTransformation, opt_state: Any, param_shardings: Any, mesh: Mesh) -> Any:
  """Shardings for `tx`'s state `opt_state` (same structure): every copy of the parameter tree in it (Adam's
  mu and nu) gets `param_shardings`, leaf for leaf; the other leaves (step counts) are replicated.

  Which subtrees are parameter trees is found structurally, by running `tx.init` on a placeholder
  (`optax.tree_utils.tree_map_params`), not by matching key paths: a state whose moments sit under
  another path still gets its parameters' layout, and a parameter tree that no longer matches the
  shardings' structure is an error rather than silently replicated moments."""
  replicated = NamedSharding(mesh, P())
  return optax.tree_utils.tree_map_params(tx, lambda _, s: s, opt_state, param_shardings,
                                          transform_non_params=lambda _: replicated)


def key_name(key: Any) -> Any:
  """The plain name of a pytree key-path entry (dict key, attribute or index)."""
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return getattr(key, attr)
  return str(key)


def flat_name(path: Sequence[Any]) -> str:
  """A pytree key path as one dotted name ("params.policy.layers.0.attn.q_proj.value"): the keys of
  the learner's checkpoints (clawjax/rl/checkpoint.py)."""
  return ".".join(str(key_name(k)) for k in path)


def batch_sharding(mesh: Mesh, ndim: int, leading: int = 0) -> NamedSharding:
  """Rows split over BATCH_AXES; `leading` unsplit axes before the row axis (micro-batch index)."""
  axes = tuple(a for a in BATCH_AXES if mesh.shape[a] > 1)
  row = axes if len(axes) > 1 else (axes[0] if axes else None)
  return NamedSharding(mesh, P(*([None] * leading), row, *([None] * (ndim - leading - 1))))


def batch_shards(mesh: Mesh) -> int:
  """How many ways batch rows are split (the row count must be a multiple of it)."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def local_row_shards(mesh: Mesh) -> tuple[int, ...]:
  """The indices (ascending) of the batch's row shards that this process's devices hold: the rows it
  prepares are a multiple of their count. Every process must hold rows of its own, as many as the others
  (no row shard on two processes), since each feeds only its own rows."""
  shards = batch_shards(mesh)
  index_map = batch_sharding(mesh, 1).devices_indices_map((shards,))
  owners: dict[int, set[int]] = {}  # row shard -> the processes holding it
  for device, (rows,) in index_map.items():
    owners.setdefault(rows.indices(shards)[0], set()).add(device.process_index)
  shared = {row: procs for row, procs in owners.items() if len(procs) > 1}
  counts = {p: sum(p in procs for procs in owners.values()) for p in range(jax.process_count())}
  if shared or len(set(counts.values())) > 1:
    raise ValueError(
        f"mesh {dict(mesh.shape)}: the batch rows (split {shards} ways over {BATCH_AXES}) must give each of the "
        f"{jax.process_count()} processes its own equal share; row shards per process: {counts}"
        + (f", row shard {min(shared)} on processes {sorted(shared[min(shared)])}" if shared else "")
        + ". Split data or fsdp across hosts and keep tensor and expert inside one")
  return tuple(sorted(row for row, procs in owners.items() if jax.process_index() in procs))
