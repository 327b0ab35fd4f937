"""Hugging Face directories <-> `Decoder`: config.json plus *.safetensors (single file or sharded index).

Names follow the Hub layout of LlamaForCausalLM / Qwen3ForCausalLM / Qwen3MoeForCausalLM (per-expert
`mlp.experts.{e}.gate_proj.weight`); transformers 5's fused in-memory expert layout
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) is accepted on load as well. Export writes the Hub
layout, so transformers, vLLM, SGLang and our own loader read it back.

`load(hf_dir, mesh=mesh)` loads shard by shard: the module is built abstractly (`nnx.eval_shape`) and each
param is made with `jax.make_array_from_callback` from the regions of the safetensors tensors that its
devices hold (`safe_open(...).get_slice`), transposing / unfusing per region, so no tensor that the mesh
splits is ever read whole (a 30B checkpoint never materialises on one host).

`save` of a model spread over several processes (clawjax.distributed) is written by all of them: each
tensor is gathered whole once and written by one process, the files spread over the processes.

`save(..., dtype=push_dtype(model.cfg))` writes the weights in the dtype the model computes with when it
stores them wider (bf16 compute over f32 master weights): the exact values every matmul and norm of its
forward uses, in half the bytes, which is what an engine needs from a weight push.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors import safe_open
from safetensors.numpy import save_file

from clawjax import distributed, sharding
from clawjax.models.config import ModelConfig
from clawjax.models.model import Decoder

INDEX_FILE = "model.safetensors.index.json"
# Files an engine needs next to the weights; copied on export when present in `copy_files_from`.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "chat_template.jinja")


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One HF tensor. in_dims=0: copied as is; n>0: a HF Linear [out, in] whose `in` features are our
  param's first n axes (ours = W.T reshaped). expert: slice of our param's leading expert axis."""
  hf_name: str
  path: tuple[Any, ...]
  in_dims: int = 0
  expert: int | None = None


def _entries(cfg: ModelConfig) -> Iterator[_Entry]:
  yield _Entry("model.embed_tokens.weight", ("embedding",))
  yield _Entry("model.norm.weight", ("final_norm", "scale"))
  if not cfg.tie_embeddings:
    yield _Entry("lm_head.weight", ("lm_head",), 1)
  for i in range(cfg.n_layers):
    hf, ours = f"model.layers.{i}.", ("layers", i)
    yield _Entry(hf + "input_layernorm.weight", ours + ("attn_norm", "scale"))
    yield _Entry(hf + "post_attention_layernorm.weight", ours + ("mlp_norm", "scale"))
    for name, in_dims in (("q_proj", 1), ("k_proj", 1), ("v_proj", 1), ("o_proj", 2)):
      yield _Entry(hf + f"self_attn.{name}.weight", ours + ("attn", name), in_dims)
    if cfg.qk_norm:
      yield _Entry(hf + "self_attn.q_norm.weight", ours + ("attn", "q_norm", "scale"))
      yield _Entry(hf + "self_attn.k_norm.weight", ours + ("attn", "k_norm", "scale"))
    if cfg.is_moe_layer(i):
      yield _Entry(hf + "mlp.gate.weight", ours + ("mlp", "router"), 1)
      for e in range(cfg.n_experts):
        for name in ("gate", "up", "down"):
          yield _Entry(hf + f"mlp.experts.{e}.{name}_proj.weight", ours + ("mlp", name), 1, e)
    else:
      for name in ("gate", "up", "down"):
        yield _Entry(hf + f"mlp.{name}_proj.weight", ours + ("mlp", name), 1)


def linear_input_dims(cfg: ModelConfig) -> dict[tuple[Any, ...], int]:
  """Each param of `cfg`'s Decoder that is one HF Linear (an expert's slice excluded), by its path in the
  model's state: how many of its leading axes are the Linear's inputs (the rest are its outputs)."""
  return {e.path: e.in_dims for e in _entries(cfg) if e.in_dims and e.expert is None}


def load_config(hf_dir: str | pathlib.Path, **runtime: Any) -> ModelConfig:
  path = pathlib.Path(hf_dir) / "config.json"
  try:
    return ModelConfig.from_hf_config(json.loads(path.read_text()), **runtime)
  except (KeyError, ValueError, OSError) as e:
    raise ValueError(f"{path}: {e}") from e


class _Tensors:
  """Lazy view of a HF directory's safetensors files (single or sharded): shapes, and regions read with
  `get_slice`, so only the requested bytes leave the file."""

  def __init__(self, hf_dir: pathlib.Path):
    index = hf_dir / INDEX_FILE
    if index.exists():
      weight_map = json.loads(index.read_text())["weight_map"]
      files = sorted(set(weight_map.values()))
    else:
      files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
    if not files:
      raise FileNotFoundError(f"{hf_dir}: no *.safetensors files")
    self.where: dict[str, pathlib.Path] = {}
    self._handles = {}
    for name in files:
      handle = safe_open(hf_dir / name, framework="np")
      self._handles[name] = handle
      for key in handle.keys():
        self.where[key] = hf_dir / name

  def _slice(self, key: str):
    return self._handles[self.where[key].name].get_slice(key)

  def shape(self, key: str) -> tuple[int, ...]:
    return tuple(self._slice(key).get_shape())

  def read(self, key: str, index: tuple[int | slice, ...]) -> np.ndarray:
    """tensor[index] (ints and unit-step slices) as a host array in the stored dtype."""
    return self._slice(key)[index]


@dataclasses.dataclass(frozen=True)
class _Source:
  """Where one HF-layout tensor is stored: `prefix` indexes the stored tensor `key` (an int picks, a
  slice offsets), e.g. expert e's gate_proj in transformers 5's fused layout is gate_up_proj[e, :F]."""
  key: str
  prefix: tuple[int | slice, ...] = ()

  def shape(self, tensors: _Tensors) -> tuple[int, ...]:
    stored = tensors.shape(self.key)
    kept = [p.stop - p.start for p in self.prefix if isinstance(p, slice)] + list(stored[len(self.prefix):])
    return tuple(kept)

  def read(self, tensors: _Tensors, region: tuple[slice, ...]) -> np.ndarray:
    """The HF-layout tensor's `region` (normalised unit-step slices, one per dim)."""
    index, rest = [], iter(region)
    for p in self.prefix:
      if isinstance(p, slice):
        r = next(rest)
        index.append(slice(p.start + r.start, p.start + r.stop))
      else:
        index.append(p)
    return tensors.read(self.key, tuple(index) + tuple(rest))


_FUSED_EXPERT = re.compile(r"(.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight")


def _source(name: str, tensors: _Tensors, cfg: ModelConfig, hf_dir: pathlib.Path) -> _Source:
  if name in tensors.where:
    return _Source(name)
  fused = _FUSED_EXPERT.fullmatch(name)
  if fused and fused[1] + "gate_up_proj" in tensors.where:
    prefix, e, f = fused[1], int(fused[2]), cfg.moe_mlp_dim
    if fused[3] == "down":
      return _Source(prefix + "down_proj", (e,))
    return _Source(prefix + "gate_up_proj", (e, slice(0, f) if fused[3] == "gate" else slice(f, 2 * f)))
  raise KeyError(f"{hf_dir}: tensor {name!r} missing from the safetensors files")


def _flat_range(region: Sequence[slice], dims: Sequence[int]) -> tuple[int, int, np.ndarray]:
  """(lo, hi, flat indices) of a box `region` of an array of shape `dims` flattened row-major."""
  grids = np.meshgrid(*[np.arange(r.start, r.stop) for r in region], indexing="ij")
  flat = np.ravel_multi_index(grids, tuple(dims)).reshape(-1)
  return int(flat.min()), int(flat.max()) + 1, flat


@dataclasses.dataclass(frozen=True)
class _ParamPlan:
  """How to read any box of one of our params: from one HF tensor, or one per expert (leading axis).

  A HF Linear [out, in] with in_dims = n maps to our [in..., out...] = W.T reshaped; a box of ours is
  read as the smallest row/column block of W covering it (exact when the split axes are the leading ones
  of their group, as the sharding rules make them), then transposed and picked."""
  shape: tuple[int, ...]      # ours (per expert for expert params)
  in_dims: int
  sources: tuple[_Source, ...]
  per_expert: bool
  dtype: Any

  def read(self, tensors: _Tensors, index: tuple[slice, ...], full_shape: tuple[int, ...]) -> np.ndarray:
    if any(s.step not in (None, 1) for s in index):
      raise ValueError(f"strided shard index {index}")
    region = tuple(slice(*s.indices(dim)[:2]) for s, dim in zip(index, full_shape))
    if not self.per_expert:
      return self._read_one(tensors, self.sources[0], region)
    experts = range(region[0].start, region[0].stop)
    return np.stack([self._read_one(tensors, self.sources[e], region[1:]) for e in experts])

  def _read_one(self, tensors: _Tensors, source: _Source, region: tuple[slice, ...]) -> np.ndarray:
    n = self.in_dims
    if not n:
      return source.read(tensors, region).astype(self.dtype)
    in_lo, in_hi, in_flat = _flat_range(region[:n], self.shape[:n])
    out_lo, out_hi, out_flat = _flat_range(region[n:], self.shape[n:])
    block_OI = source.read(tensors, (slice(out_lo, out_hi), slice(in_lo, in_hi)))
    picked_IO = block_OI.T[np.ix_(in_flat - in_lo, out_flat - out_lo)]
    return picked_IO.reshape([r.stop - r.start for r in region]).astype(self.dtype)


def _plans(cfg: ModelConfig, tensors: _Tensors, params: dict[tuple[Any, ...], Any],
           hf_dir: pathlib.Path) -> dict[tuple[Any, ...], _ParamPlan]:
  """A read plan per param, after checking every HF tensor's shape against config.json."""
  sources: dict[tuple[Any, ...], list[tuple[_Entry, _Source]]] = {}
  for entry in _entries(cfg):
    sources.setdefault(entry.path, []).append((entry, _source(entry.hf_name, tensors, cfg, hf_dir)))
  plans = {}
  for path, pairs in sources.items():
    entry = pairs[0][0]
    target = params[path]
    shape = tuple(target.shape[1:] if entry.expert is not None else target.shape)
    n = entry.in_dims
    expected = (math.prod(shape[n:]), math.prod(shape[:n])) if n else shape
    for e, source in pairs:
      if source.shape(tensors) != expected:
        raise ValueError(f"{tensors.where[source.key]}: {e.hf_name} has shape {source.shape(tensors)}, "
                         f"config.json implies {expected}")
    plans[path] = _ParamPlan(shape, n, tuple(s for _, s in pairs), entry.expert is not None,
                             np.dtype(jnp.dtype(cfg.param_dtype)))
  return plans


def _check_all_used(cfg: ModelConfig, tensors: _Tensors, plans: dict[tuple[Any, ...], _ParamPlan],
                    hf_dir: pathlib.Path) -> None:
  used = {s.key for plan in plans.values() for s in plan.sources}
  ignorable = {k for k in tensors.where if k.endswith("rotary_emb.inv_freq")}
  if cfg.tie_embeddings:
    ignorable.add("lm_head.weight")
  unexpected = sorted(set(tensors.where) - used - ignorable)
  if unexpected:
    raise ValueError(f"{hf_dir}: tensors that a {cfg.family} config.json does not explain, e.g. "
                     f"{unexpected[:3]} (in {tensors.where[unexpected[0]].name})")


def _fill(plan: _ParamPlan, tensors: _Tensors, shape: tuple[int, ...], target: jax.sharding.Sharding | None
          ) -> jax.Array:
  full = tuple(slice(None) for _ in shape)
  if target is None:
    return jnp.asarray(plan.read(tensors, full, shape))
  cache: dict[tuple, np.ndarray] = {}  # devices that replicate a shard share one read

  def shard(index: tuple[slice, ...]) -> np.ndarray:
    key = tuple(s.indices(dim) for s, dim in zip(index, shape))
    if key not in cache:
      cache[key] = plan.read(tensors, index, shape)
    return cache[key]

  return jax.make_array_from_callback(shape, target, shard)


def load(hf_dir: str | pathlib.Path, *, mesh: Mesh | None = None,
         rules: Sequence[tuple[str, Any]] = sharding.DEFAULT_RULES, **runtime: Any) -> Decoder:
  """A `Decoder` with the weights of a local HF directory, stored in `param_dtype` (runtime field).

  Without `mesh`, each param is read whole onto the default device. With `mesh`, each param is created
  sharded by `rules` (`sharding.state_shardings`), each distinct shard read once from the files for the
  devices that hold it (a process reads only its own devices' shards); the model can go to
  `Learner(..., mesh=mesh, rules=rules)` without another copy (the learner then owns, and donates, its
  arrays)."""
  hf_dir = pathlib.Path(hf_dir)
  cfg = load_config(hf_dir, **runtime)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  params = dict(nnx.to_flat_state(abstract))
  tensors = _Tensors(hf_dir)
  plans = _plans(cfg, tensors, params, hf_dir)
  _check_all_used(cfg, tensors, plans, hf_dir)
  targets = {path: var.get_value() for path, var in
             nnx.to_flat_state(sharding.state_shardings(abstract, mesh, rules))} if mesh else {}
  flat = [(path, var.replace(_fill(plans[path], tensors, tuple(var.shape), targets.get(path))))
          for path, var in params.items()]
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _exported(model: Decoder) -> list[tuple[_Entry, jax.Array]]:
  """Each HF tensor's entry with the param it is read from (for an expert, the param of all experts)."""
  params = {path: var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  return [(entry, params[entry.path]) for entry in _entries(model.cfg)]


def _nbytes(entry: _Entry, param: jax.Array, dtype: str | None) -> int:
  shape = param.shape[1:] if entry.expert is not None else param.shape
  return math.prod(shape) * jnp.dtype(dtype or param.dtype).itemsize


def push_dtype(cfg: ModelConfig) -> str:
  """The narrower of the compute and the storage dtype: the forward casts every param (norm scales,
  embedding and router included) to `cfg.dtype` before use, so an engine given these values computes
  with exactly the learner's weights; with bf16 compute over f32 params that halves a push's bytes."""
  return min((cfg.dtype, cfg.param_dtype), key=lambda d: jnp.dtype(d).itemsize)


def hf_layout(w: jax.Array, in_dims: int, dtype: str | None = None) -> jax.Array:
  """One of our params as its HF tensor: a Linear's [in..., out...] becomes W [out, in], cast to `dtype`
  (None: kept); the engine's one-row copy is this layout too. Done on the devices, not the host: XLA's transpose is several times faster than numpy's
  strided copy (most of an export's time on CPU), and the host receives contiguous bytes."""
  if in_dims:
    w = w.reshape(math.prod(w.shape[:in_dims]), -1).T
  return w.astype(dtype) if dtype else w


_hf_layout = jax.jit(hf_layout, static_argnames=("in_dims", "dtype"))
# One expert of a param of all experts; the index is traced, so one program serves every expert (an
# eager slice per expert costs a dispatch each: ~18K of them for Qwen3-30B-A3B).
_expert_hf_layout = jax.jit(lambda w, e, in_dims, dtype: hf_layout(jax.lax.dynamic_index_in_dim(w, e, keepdims=False),
                                                                in_dims, dtype), static_argnames=("in_dims", "dtype"))


@dataclasses.dataclass(frozen=True)
class ExportFile:
  """One safetensors file of an export: the HF tensors it holds, and the process that writes it."""
  name: str
  owner: int
  tensors: tuple[str, ...]


def _runs_up_to(sizes: Sequence[tuple[str, int]], max_bytes: int) -> list[list[str]]:
  """Consecutive tensors in files of at most `max_bytes` (a larger tensor alone), Hugging Face's rule."""
  files: list[list[str]] = [[]]
  size = 0
  for name, nbytes in sizes:
    if size + nbytes > max_bytes and files[-1]:
      files.append([])
      size = 0
    files[-1].append(name)
    size += nbytes
  return files


def plan_files(sizes: Sequence[tuple[str, int]], processes: int, max_shard_bytes: int) -> list[ExportFile]:
  """Which file holds each tensor (`sizes`: (HF name, bytes) in export order) and which process writes it.

  One process: files of at most `max_shard_bytes` in order, a single one named model.safetensors.
  Several: the tensors split into one run of consecutive tensors per process, of about equal bytes, each
  run cut into files the same way; every file is model-i-of-n (with an index)."""
  total = max(sum(n for _, n in sizes), 1)
  runs: list[list[tuple[str, int]]] = [[] for _ in range(processes)]
  done = 0
  for name, nbytes in sizes:
    runs[min(processes - 1, int((done + nbytes / 2) * processes / total))].append((name, nbytes))
    done += nbytes
  groups = [(owner, names) for owner, run in enumerate(runs) if run for names in _runs_up_to(run, max_shard_bytes)]
  if processes == 1 and len(groups) == 1:
    return [ExportFile("model.safetensors", 0, tuple(groups[0][1]))]
  return [ExportFile(f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors", owner, tuple(names))
          for i, (owner, names) in enumerate(groups)]


def save(model: Decoder, out_dir: str | pathlib.Path, *, max_shard_bytes: int = 5 * 2**30,
         copy_files_from: str | pathlib.Path | None = None, dtype: str | None = None) -> pathlib.Path:
  """Writes config.json and safetensors (sharded with an index above `max_shard_bytes`, HF's default
  5 GiB) in the HF layout; copies tokenizer/chat-template files from `copy_files_from` if given.
  `dtype` (e.g. "bfloat16", `push_dtype(model.cfg)`): every tensor cast to it (rounded to nearest, on
  the devices, before any gather) and config.json's torch_dtype set to it; None keeps the params' own.

  A model whose params are spread over several processes (the learner's in a multi-process run) is
  written by all of them together: every process calls `save` with the same `out_dir`, on a filesystem
  they all see. Each tensor is gathered whole in turn and kept only by the process that writes it
  (`plan_files`: consecutive runs of tensors, one per process), so no process holds more than its own
  files; process 0 writes the index, config.json and the side files. `save` returns on each process
  once every file is written."""
  out_dir = pathlib.Path(out_dir)
  exported = _exported(model)
  dtype = jnp.dtype(dtype).name if dtype else None
  spread = any(not param.is_fully_addressable for _, param in exported)
  processes, me = (distributed.process_count(), distributed.process_index()) if spread else (1, 0)
  out_dir.mkdir(parents=True, exist_ok=True)
  if me == 0:
    for stale in list(out_dir.glob("*.safetensors")) + [out_dir / INDEX_FILE]:
      stale.unlink(missing_ok=True)
  if spread:
    distributed.sync("hf_io.save: out_dir cleared")
  sizes = [(entry.hf_name, _nbytes(entry, param, dtype)) for entry, param in exported]
  files = plan_files(sizes, processes, max_shard_bytes)
  file_of = {name: f for f in files for name in f.tensors}
  held: dict[str, dict[str, np.ndarray]] = {}
  for entry, param in exported:
    # Gathered on every process (a collective when spread), one expert at a time; kept by the writer only.
    tensor = (_hf_layout(param, entry.in_dims, dtype) if entry.expert is None
              else _expert_hf_layout(param, entry.expert, entry.in_dims, dtype))
    whole = distributed.gather(tensor)
    f = file_of[entry.hf_name]
    if f.owner != me:
      continue
    held.setdefault(f.name, {})[entry.hf_name] = whole
    if len(held[f.name]) == len(f.tensors):
      save_file(held.pop(f.name), out_dir / f.name, metadata={"format": "pt"})
  if me == 0:
    if len(files) > 1 or files[0].name != "model.safetensors":
      index = {"metadata": {"total_size": sum(n for _, n in sizes)},
               "weight_map": {name: f.name for f in files for name in f.tensors}}
      (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
    hf_config = {**model.cfg.to_hf_config(), **({"torch_dtype": dtype} if dtype else {})}
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    if copy_files_from is not None:
      for name in SIDE_FILES:
        src = pathlib.Path(copy_files_from) / name
        if src.exists() and src.resolve() != (out_dir / name).resolve():
          shutil.copy(src, out_dir / name)
  if spread:
    distributed.sync("hf_io.save: files written")
  return out_dir
