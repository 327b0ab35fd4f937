"""Hugging Face directories <-> `Decoder`: config.json plus *.safetensors (single file or sharded index).

Names follow the Hub layout of LlamaForCausalLM / Qwen3ForCausalLM / Qwen3MoeForCausalLM (per-expert
`mlp.experts.{e}.gate_proj.weight`); transformers 5's fused in-memory expert layout
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`) is accepted on load as well. Export writes the Hub
layout, so transformers, vLLM, SGLang and our own loader read it back.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from safetensors import safe_open
from safetensors.flax import save_file

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


def load_config(hf_dir: str | pathlib.Path, **runtime: Any) -> ModelConfig:
  path = pathlib.Path(hf_dir) / "config.json"
  try:
    return ModelConfig.from_hf_config(json.loads(path.read_text()), **runtime)
  except (KeyError, ValueError, OSError) as e:
    raise ValueError(f"{path}: {e}") from e


class _Tensors:
  """Lazy name -> array view of a HF directory's safetensors files (single or sharded)."""

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
      handle = safe_open(hf_dir / name, framework="flax")
      self._handles[name] = handle
      for key in handle.keys():
        self.where[key] = hf_dir / name

  def get(self, key: str) -> jax.Array:
    return self._handles[self.where[key].name].get_tensor(key)


_FUSED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def _unfuse_experts(tensors: _Tensors, cfg: ModelConfig) -> dict[str, jax.Array]:
  """Per-expert HF names for transformers-5 fused expert tensors, if the checkpoint uses them."""
  out = {}
  f = cfg.moe_mlp_dim
  for key in [k for k in tensors.where if k.endswith(_FUSED_EXPERTS[0])]:
    prefix = key[: -len("gate_up_proj")]
    gate_up_EFD, down_EDF = tensors.get(key), tensors.get(prefix + "down_proj")
    for e in range(gate_up_EFD.shape[0]):
      out[f"{prefix}{e}.gate_proj.weight"] = gate_up_EFD[e, :f]
      out[f"{prefix}{e}.up_proj.weight"] = gate_up_EFD[e, f:]
      out[f"{prefix}{e}.down_proj.weight"] = down_EDF[e]
  return out


def load(hf_dir: str | pathlib.Path, **runtime: Any) -> Decoder:
  """A `Decoder` with the weights of a local HF directory, stored in `param_dtype` (runtime field)."""
  hf_dir = pathlib.Path(hf_dir)
  cfg = load_config(hf_dir, **runtime)
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
  params = {path: var for path, var in nnx.to_flat_state(abstract)}
  tensors = _Tensors(hf_dir)
  fused = _unfuse_experts(tensors, cfg)
  values: dict[tuple[Any, ...], Any] = {}
  used = set()
  for entry in _entries(cfg):
    if entry.hf_name in fused:
      w = fused[entry.hf_name]
    elif entry.hf_name in tensors.where:
      w = tensors.get(entry.hf_name)
      used.add(entry.hf_name)
    else:
      raise KeyError(f"{hf_dir}: tensor {entry.hf_name!r} missing from the safetensors files")
    target = params[entry.path]
    shape = target.shape[1:] if entry.expert is not None else target.shape
    n = entry.in_dims
    expected = (math.prod(shape[n:]), math.prod(shape[:n])) if n else tuple(shape)
    if tuple(w.shape) != expected:
      raise ValueError(f"{tensors.where.get(entry.hf_name, hf_dir)}: {entry.hf_name} has shape "
                       f"{tuple(w.shape)}, config.json implies {expected}")
    w = (w.T if n else w).reshape(shape).astype(cfg.param_dtype)  # HF Linear [out, in] -> [in..., out...]
    if entry.expert is None:
      values[entry.path] = w
    else:
      values.setdefault(entry.path, [None] * cfg.n_experts)[entry.expert] = w
  ignorable = {k for k in tensors.where if k.endswith(_FUSED_EXPERTS) or k.endswith("rotary_emb.inv_freq")}
  if cfg.tie_embeddings:
    ignorable.add("lm_head.weight")
  unexpected = sorted(set(tensors.where) - used - ignorable)
  if unexpected:
    raise ValueError(f"{hf_dir}: tensors that a {cfg.family} config.json does not explain, e.g. "
                     f"{unexpected[:3]} (in {tensors.where[unexpected[0]].name})")
  flat = []
  for path, var in params.items():
    value = values[path]
    flat.append((path, var.replace(jnp.stack(value) if isinstance(value, list) else value)))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _hf_tensors(model: Decoder) -> Iterator[tuple[str, jax.Array]]:
  params = {path: var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for entry in _entries(model.cfg):
    w = params[entry.path]
    if entry.expert is not None:
      w = w[entry.expert]
    if entry.in_dims:
      w = w.reshape(math.prod(w.shape[:entry.in_dims]), -1).T
    yield entry.hf_name, w


def save(model: Decoder, out_dir: str | pathlib.Path, *, max_shard_bytes: int = 5 * 2**30,
         copy_files_from: str | pathlib.Path | None = None) -> pathlib.Path:
  """Writes config.json and safetensors (sharded with an index above `max_shard_bytes`, HF's default
  5 GiB) in the HF layout; copies tokenizer/chat-template files from `copy_files_from` if given."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  shards: list[dict[str, jax.Array]] = [{}]
  size = 0
  for name, w in _hf_tensors(model):
    if size + w.nbytes > max_shard_bytes and shards[-1]:
      shards.append({})
      size = 0
    shards[-1][name] = jnp.asarray(w)  # contiguous copy: transposed views are not serialisable
    size += w.nbytes
  for stale in list(out_dir.glob("*.safetensors")) + [out_dir / INDEX_FILE]:
    stale.unlink(missing_ok=True)
  if len(shards) == 1:
    save_file(shards[0], out_dir / "model.safetensors", metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, out_dir / name, metadata={"format": "pt"})
      weight_map.update(dict.fromkeys(shard, name))
    total = sum(w.nbytes for shard in shards for w in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2))
  (out_dir / "config.json").write_text(json.dumps(model.cfg.to_hf_config(), indent=2) + "\n")
  if copy_files_from is not None:
    for name in SIDE_FILES:
      src = pathlib.Path(copy_files_from) / name
      if src.exists() and src.resolve() != (out_dir / name).resolve():
        shutil.copy(src, out_dir / name)
  return out_dir
