"""KV-cache prefill and decode for the `clawjax.models` Decoder, jitted with bucketed static shapes.

The cache holds keys and values of shape [layers, slots, kv_heads, capacity, head_dim], where
capacity = max_seq_len + prefill_chunk: the margin absorbs the padding of a bucketed prefill chunk and is
where padding rows, and rows that ended within a decode chunk, write, so padding never lands on a
retained prefix. Attention reads only the first `cache_len` positions, a power of two (>= min_bucket)
covering every query; batches are padded to powers of two: the number of compiled programs grows with
log(max_seq_len) * log(max_running), not with the lengths and loads seen.

Decode: one dispatch runs up to `steps` decode steps for every running sequence in a `lax.while_loop`
on the device: sampling, log-probs, stop tokens and length limits are all computed there, a sequence
that ends is masked for the rest of the chunk, and the loop stops early once every sequence has ended.
The host receives [rows, steps] tokens and log-probs and how many of them each row produced.
Prefill: one dispatch computes a chunk of the input of each of several requests, and samples the token
that follows each (used where the chunk is a request's last).

The weights are the model's leaves in the engine's shardings and, where `EngineConfig.one_row_copy` is on,
a second copy of the dense Linears laid out [outputs, inputs] that dispatches of one row read
(weight_layout.py): XLA's CPU matrix-vector product is faster over it, its products of 2-32 rows slower.
The layers are unrolled, over one array per weight: on CPU a `lax.scan` over stacked weights copies
each layer's slice before its matmuls (half of a SmolLM2-135M decode step), and an unrolled decode is
what accelerator engines run too. A compile costs every layer.

Routes (`EngineConfig.record_routes`, a MoE model): the same programs also return the expert ids each MoE
layer chose for every token they compute ([B, T, moe_layers, top_k], uint8 while n_experts <= 256), the
decode loop's per step beside its tokens: one transfer per dispatch, as the tokens. Off, the programs are
those without (nothing computed or fetched).

Sampling happens in the same programs (sampling.py): a row's PRNG key is fold_in(request key, index of
the output token), so a request's draws depend neither on the batch it shares nor on how many decode
steps a dispatch runs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from clawjax import sharding
from clawjax.engine import sampling
from clawjax.engine.weight_layout import engine_shape, engine_sharding, input_dims, linear
from clawjax.generation import SamplingParams
from clawjax.models.attention import (masked_attention, online_softmax_init, online_softmax_result,
                                      online_softmax_step)
from clawjax.models.hf_io import hf_layout, push_dtype
from clawjax.models.layers import MLP, einsum_f32
from clawjax.models.moe import MoE

KVCache = tuple[jax.Array, jax.Array]  # keys, values: [layers, slots, kv_heads, capacity, head_dim]
# (the model's nnx.State leaves in the engine's shardings, the one-row copy of its Linears or [])
Weights = tuple[list[jax.Array], list[jax.Array]]
STOP_BUCKET = 4  # stop-token lists are padded to a power of two from here (one program for the usual 1-4)


class ModelLayout:
  """Projections over the model's own weights (every dispatch of several rows, or without a one-row copy)."""

  @staticmethod
  def qkv(attn, x_BTD: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return attn.project_qkv(x_BTD, positions_BT)

  @staticmethod
  def out(attn, o_BTNH: jax.Array) -> jax.Array:
    """`attn.project_out` as one contraction over the flattened (heads, head_dim): with both dims
    contracted, XLA's CPU backend transposes the whole weight at every call, a third of a one-token
    SmolLM2-135M decode step. (The learner keeps the model's own: its steps are large, and remat and
    plain steps agree to 1e-5 with it.)"""
    b, t, n, h = o_BTNH.shape
    w_MD = attn.o_proj[...].astype(attn.cfg.dtype).reshape(n * h, -1)
    return o_BTNH.astype(attn.cfg.dtype).reshape(b, t, n * h) @ w_MD

  @staticmethod
  def mlp(mlp, x_BTD: jax.Array) -> jax.Array:
    return mlp(x_BTD)

  @staticmethod
  def logits(model, x_BD: jax.Array) -> jax.Array:
    return model.logits(x_BD)


class OneRowLayout:
  """Projections over the one-row copy: each dense Linear [outputs, inputs] (weight_layout.py)."""

  @staticmethod
  def qkv(attn, x_BTD: jax.Array, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    cfg = attn.cfg
    b, t, _ = x_BTD.shape
    heads = lambda w, n: linear(x_BTD, w[...], cfg.dtype).reshape(b, t, n, cfg.head_dim)
    return attn.position_qkv(heads(attn.q_proj, cfg.n_heads), heads(attn.k_proj, cfg.n_kv_heads),
                             heads(attn.v_proj, cfg.n_kv_heads), positions_BT)

  @staticmethod
  def out(attn, o_BTNH: jax.Array) -> jax.Array:
    b, t, n, h = o_BTNH.shape
    return linear(o_BTNH.reshape(b, t, n * h), attn.o_proj[...], attn.cfg.dtype)

  @staticmethod
  def mlp(mlp, x_BTD: jax.Array) -> jax.Array:
    """A dense MLP over the copy; a MoE layer as the model runs it (its weights have no copy)."""
    if not isinstance(mlp, MLP):
      return mlp(x_BTD)
    gate_BTF, up_BTF = (linear(x_BTD, w[...], mlp.dtype) for w in (mlp.gate, mlp.up))
    return linear(jax.nn.silu(gate_BTF) * up_BTF, mlp.down[...], mlp.dtype)

  @staticmethod
  def logits(model, x_BD: jax.Array) -> jax.Array:
    """The tied embedding and the copy's lm_head are both [vocab, d_model]."""
    table_VD = model.embedding if model.lm_head is None else model.lm_head
    dtype = model.cfg.dtype
    return einsum_f32("bd,vd->bv", x_BD.astype(dtype), table_VD[...].astype(dtype))


def bucket(n: int, minimum: int, maximum: int) -> int:
  """The smallest power of two >= max(n, minimum), capped at `maximum`."""
  return min(maximum, max(minimum, 1 << max(0, n - 1).bit_length()))


@dataclasses.dataclass(frozen=True)
class Programs:
  """Static structure of the engine's programs: the model's graph, the tree of its weights, the cache's
  capacity and sharding. The hash is computed once: jit hashes this static argument at every dispatch."""
  graphdef: nnx.GraphDef
  treedef: Any
  capacity: int
  cache_sharding: NamedSharding
  attention_block: int
  linears: tuple[int, ...]  # the leaves that the one-row copy holds laid out [outputs, inputs]
  routes: bool = False      # the programs return the MoE layers' expert ids (EngineConfig.record_routes)

  def __post_init__(self):
    object.__setattr__(self, "_hash", hash((self.graphdef, self.treedef, self.capacity, self.cache_sharding,
                                            self.attention_block, self.linears, self.routes)))

  def __hash__(self) -> int:
    return self._hash

  def model(self, weights: Weights, rows: int):
    """The model over the weights, and the layout its projections read: a dispatch of one row reads the
    one-row copy where there is one."""
    leaves, one_row = weights
    if rows > 1 or not one_row:
      return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves)), ModelLayout
    leaves = list(leaves)
    for i, w in zip(self.linears, one_row):
      leaves[i] = w
    return nnx.merge(self.graphdef, jax.tree.unflatten(self.treedef, leaves)), OneRowLayout


class SamplingRows(NamedTuple):
  """Per row: the request's raw PRNG key and its sampling parameters."""
  key_data: jax.Array  # [B, 2] uint32
  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array

  def draw(self, logits_BV: jax.Array, steps_B: jax.Array, truncate: bool) -> tuple[jax.Array, jax.Array]:
    """The tokens at output index steps_B of each row's request, and their log-probs."""
    keys_B = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(self.key_data), steps_B)
    return sampling.sample(logits_BV, keys_B, self.temperature, self.top_k, self.top_p, truncate)


class PrefillRows(NamedTuple):
  slots: jax.Array     # [B] cache slot of each row
  tokens: jax.Array    # [B, T] the chunk, padded
  starts: jax.Array    # [B] position of the chunk's first token
  n_valid: jax.Array   # [B] tokens of the chunk before its padding
  reach: jax.Array     # [] the last position of a chunk's token (padding rows and tokens lie past it)
  sampling: SamplingRows


class DecodeRows(NamedTuple):
  slots: jax.Array      # [A]
  tokens: jax.Array     # [A] the last token of each sequence (its keys/values are not cached yet)
  positions: jax.Array  # [A] its position
  steps: jax.Array      # [A] output index of the next token
  remaining: jax.Array  # [A] tokens the sequence may still produce (0: a padding row)
  stop_ids: jax.Array   # [A, S] stop tokens, padded with -1
  sampling: SamplingRows


def _forward(programs: Programs, weights: Weights, cache: KVCache, tokens_BT: jax.Array, positions_BT: jax.Array,
             slots_B: jax.Array, write_positions_BT: jax.Array, cache_len: int, reach: jax.Array):
  """Every decoder layer over `tokens_BT`: its keys/values go into the cache at (slot, write position),
  then the queries attend causally (by position) to the slot's first `cache_len` positions. Queries past
  position `reach` (padding) are computed but not read: their attention may stop there. Returns the
  model, the projections' layout, the last layer's output (before the final norm), the cache, and with
  `programs.routes` the MoE layers' expert ids [B, T, moe_layers, top_k] (else None)."""
  model, layout = programs.model(weights, tokens_BT.size)
  k_cache, v_cache = cache
  slots_B1 = slots_B[:, None]
  x_BTD = model.embed(tokens_BT)
  routes = []
  for i, layer in enumerate(model.layers):
    q_BTNH, k_BTKH, v_BTKH = layout.qkv(layer.attn, layer.attn_norm(x_BTD), positions_BT)
    k_cache = k_cache.at[i, slots_B1, :, write_positions_BT].set(k_BTKH.astype(k_cache.dtype))
    v_cache = v_cache.at[i, slots_B1, :, write_positions_BT].set(v_BTKH.astype(v_cache.dtype))
    o_BTNH = cached_attention(q_BTNH, k_cache, v_cache, i, slots_B, positions_BT, cache_len,
                              programs.attention_block, reach)
    x_BTD = x_BTD + layout.out(layer.attn, o_BTNH)
    if programs.routes and isinstance(layer.mlp, MoE):  # (the same block, also giving the ids it used)
      mlp_BTD, experts_BTK, _ = layer.mlp.forward(layer.mlp_norm(x_BTD))
      routes.append(experts_BTK.astype(route_dtype(model.cfg)))
    else:
      mlp_BTD = layout.mlp(layer.mlp, layer.mlp_norm(x_BTD))
    x_BTD = x_BTD + mlp_BTD
  cache = tuple(jax.lax.with_sharding_constraint(c, programs.cache_sharding) for c in (k_cache, v_cache))
  return model, layout, x_BTD, cache, jnp.stack(routes, axis=2) if routes else None


def route_dtype(cfg) -> jnp.dtype:
  """Recorded expert ids: uint8 while n_experts <= 256 (clawjax.routes)."""
  return jnp.dtype(jnp.uint8 if cfg.n_experts <= 256 else jnp.uint16)


def cached_attention(q_BTNH: jax.Array, k_cache: jax.Array, v_cache: jax.Array, layer: int, slots_B: jax.Array,
                     positions_BT: jax.Array, cache_len: int, block: int, reach: jax.Array) -> jax.Array:
  """The queries' attention to their slots' cached keys at positions <= their own, among the first
  `cache_len`; exact for the queries at positions <= `reach` (the others are padding, never read).

  Up to `block` keys, one [T, S] score array. Beyond it, an online softmax over key blocks read from the
  cache in place, stopping after the block that holds position `reach`: a 2,048-token prefill chunk of a
  64K context would otherwise hold [heads, 2,048, 65,536] float32 scores per row (17 GB at 32 heads), and
  the rows' keys would be copied out of the cache whole in every layer. The reach is the real queries',
  not the padding rows' (which sit at the end of the cache: every row would read all of it).
  """
  if cache_len <= block:
    # Each slot's keys of one head are contiguous: the rows' reads are block copies, already in the
    # layout the attention's matmuls take.
    k_BSKH = k_cache[layer, slots_B, :, :cache_len].swapaxes(1, 2).astype(q_BTNH.dtype)
    v_BSKH = v_cache[layer, slots_B, :, :cache_len].swapaxes(1, 2).astype(q_BTNH.dtype)
    return masked_attention(q_BTNH, k_BSKH, v_BSKH, jnp.arange(cache_len)[None, None, :] <= positions_BT[:, :, None])
  b, t, n, h = q_BTNH.shape
  kv = k_cache.shape[2]
  q_BTKGH = q_BTNH.reshape(b, t, kv, n // kv, h)
  slots_B1 = slots_B[:, None]

  def key_block(j, carry):
    index_S = j * block + jnp.arange(block)
    k_BSKH = k_cache[layer, slots_B1, :, index_S[None]].astype(q_BTNH.dtype)
    v_BSKH = v_cache[layer, slots_B1, :, index_S[None]].astype(q_BTNH.dtype)
    mask_B11TS = (index_S[None, None, :] <= positions_BT[:, :, None])[:, None, None]
    s_BKGTS = einsum_f32("btkgh,bskh->bkgts", q_BTKGH, k_BSKH) * h ** -0.5
    return online_softmax_step(carry, s_BKGTS, mask_B11TS, v_BSKH)

  reached = reach // block + 1  # cache_len covers every real query: at most ceil(cache_len / block)
  carry = jax.lax.fori_loop(0, reached, key_block, online_softmax_init((b, kv, n // kv, t), h))
  return jnp.einsum("bkgth->btkgh", online_softmax_result(carry)).reshape(b, t, n, h).astype(q_BTNH.dtype)


# Module-level jitted programs: engines over the same architecture share compilations.
@functools.partial(jax.jit, static_argnames=("programs", "cache_len", "truncate"), donate_argnums=(2,))
def _prefill_program(programs: Programs, weights: Weights, cache: KVCache, rows: PrefillRows, *, cache_len: int,
                     truncate: bool):
  positions_BT = rows.starts[:, None] + jnp.arange(rows.tokens.shape[1], dtype=jnp.int32)[None]
  model, layout, x_BTD, cache, routes_BTLK = _forward(programs, weights, cache, rows.tokens, positions_BT,
                                                      rows.slots, positions_BT, cache_len, rows.reach)
  last_BD = jnp.take_along_axis(x_BTD, (rows.n_valid - 1)[:, None, None], axis=1)[:, 0]
  tokens_B, logprobs_B = rows.sampling.draw(layout.logits(model, model.final_norm(last_BD)),
                                            jnp.zeros_like(rows.n_valid), truncate)
  return cache, tokens_B, logprobs_B, routes_BTLK


@functools.partial(jax.jit, static_argnames=("programs", "cache_len", "steps", "truncate"), donate_argnums=(2,))
def _decode_program(programs: Programs, weights: Weights, cache: KVCache, rows: DecodeRows, *, cache_len: int,
                    steps: int, truncate: bool):
  """Up to `steps` tokens for each row: ([A, steps] tokens, [A, steps] log-probs, [A] how many are real,
  and with `programs.routes` [A, steps, moe_layers, top_k] the expert ids of the token each step fed, else
  None)."""
  a = rows.slots.shape[0]
  scratch_A = jnp.full((a,), programs.capacity - 1, jnp.int32)

  def body(carry):
    i, cache, tokens_A, positions_A, produced_A, done_A, out_tokens_AK, out_logprobs_AK, out_routes = carry
    live_A = ~done_A
    # A row that has ended computes on, but writes where nothing is ever read and counts nothing.
    write_A = jnp.where(live_A, positions_A, scratch_A)
    model, layout, x_A1D, cache, routes_A1LK = _forward(programs, weights, cache, tokens_A[:, None],
                                                        positions_A[:, None], rows.slots, write_A[:, None],
                                                        cache_len, jnp.max(jnp.where(live_A, positions_A, 0)))
    sampled_A, logprobs_A = rows.sampling.draw(layout.logits(model, model.final_norm(x_A1D[:, 0])),
                                               rows.steps + i, truncate)
    produced_A = produced_A + live_A
    stopped_A = jnp.any(sampled_A[:, None] == rows.stop_ids, axis=1)
    done_A = done_A | stopped_A | (produced_A >= rows.remaining)
    if routes_A1LK is not None:
      out_routes = out_routes.at[:, i].set(routes_A1LK[:, 0])
    return (i + 1, cache, jnp.where(live_A, sampled_A, tokens_A), positions_A + live_A, produced_A, done_A,
            out_tokens_AK.at[:, i].set(sampled_A), out_logprobs_AK.at[:, i].set(logprobs_A), out_routes)

  def more(carry):
    return (carry[0] < steps) & ~jnp.all(carry[5])

  zeros_A = jnp.zeros((a,), jnp.int32)
  routes = None
  if programs.routes:
    cfg = programs.model(weights, a)[0].cfg
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    routes = jnp.zeros((a, steps, moe_layers, cfg.top_k), route_dtype(cfg))
  init = (jnp.int32(0), cache, rows.tokens, rows.positions, zeros_A, rows.remaining <= 0,
          jnp.zeros((a, steps), jnp.int32), jnp.zeros((a, steps), jnp.float32), routes)
  _, cache, _, _, produced_A, _, tokens_AK, logprobs_AK, routes = jax.lax.while_loop(more, body, init)
  return cache, tokens_AK, logprobs_AK, produced_A, routes


@functools.partial(jax.jit, static_argnums=(1, 2))
def _laid_out(w: jax.Array, in_dims: int, sharding: NamedSharding) -> jax.Array:
  return jax.lax.with_sharding_constraint(hf_layout(w, in_dims), sharding)


@dataclasses.dataclass(frozen=True)
class PrefillChunk:
  """Input tokens start.. of a request, to be written into its slot."""
  slot: int
  tokens: np.ndarray
  start: int
  key_data: np.ndarray
  params: SamplingParams


@dataclasses.dataclass(frozen=True)
class DecodeRow:
  slot: int
  token: int        # the last token (input or output) of the sequence
  position: int     # its position
  key_data: np.ndarray
  step: int         # output index of the next token
  remaining: int    # tokens it may still produce, >= 1
  params: SamplingParams


def one_row_copy(setting: str, platform: str) -> bool:
  """EngineConfig.one_row_copy on a platform: "auto" is on for CPU only (accelerators' matrix-vector
  products read either layout at full speed, and their memory holds the weights once)."""
  return platform == "cpu" if setting == "auto" else setting == "on"


def cache_dtype(name: str, platform: str) -> jnp.dtype:
  """EngineConfig.cache_dtype on a platform: "auto" is float32 on CPU (log-probs equal to the learner's
  to float32 rounding: what the tests check) and bfloat16 on GPU / TPU."""
  return jnp.dtype(("float32" if platform == "cpu" else "bfloat16") if name == "auto" else name)


def _truncates(rows: list[PrefillChunk] | list[DecodeRow]) -> bool:
  """Whether a dispatch's programs apply top-k / top-p (a compiled variant of their own)."""
  return any(sampling.needs_truncation(r.params) for r in rows)


def _sampling_rows(n: int, rows: list[PrefillChunk] | list[DecodeRow]) -> SamplingRows:
  """Padding rows past len(rows) are greedy (no truncation to compute)."""
  keys, temperature = np.zeros((n, 2), np.uint32), np.zeros(n, np.float32)
  top_k, top_p = np.zeros(n, np.int32), np.ones(n, np.float32)
  for a, row in enumerate(rows):
    keys[a], temperature[a], top_k[a], top_p[a] = (row.key_data, row.params.temperature, row.params.top_k,
                                                   row.params.top_p)
  return SamplingRows(keys, temperature, top_k, top_p)


class KVRunner:
  """Prefill and decode for one model architecture and engine configuration (host-side batching), on a
  set of devices: weights split over them along heads / mlp / vocab where those divide (tensor
  parallelism, `sharding.DEFAULT_RULES`' "tensor" axis), the cache along its kv heads."""

  def __init__(self, model, config, devices: list[jax.Device]):
    self.model_config = model.cfg
    self.config = config
    self.capacity = config.max_seq_len + config.prefill_chunk
    self.devices = devices
    self.mesh = Mesh(np.asarray(devices), ("tensor",))
    state = nnx.state(model)
    key_paths, leaves = zip(*jax.tree.flatten_with_path(state)[0])
    self._paths = [jax.tree_util.keystr(p) for p in key_paths]
    self._shapes = {p: x.shape for p, x in zip(self._paths, leaves)}
    self._dtypes = {p: x.dtype for p, x in zip(self._paths, leaves)}
    self._shardings = jax.tree.leaves(sharding.state_shardings(state, self.mesh))
    self.one_row_copy = one_row_copy(config.one_row_copy, devices[0].platform)
    in_dims = input_dims(model.cfg, key_paths)
    self._linears = tuple(i for i, n in enumerate(in_dims) if n and self.one_row_copy)
    self._one_row = [(in_dims[i], engine_sharding(self._shardings[i], leaves[i].ndim, in_dims[i]))
                     for i in self._linears]
    self.weight_dtype = jnp.dtype(push_dtype(model.cfg))
    cfg = model.cfg
    self.cache_shape = (cfg.n_layers, config.max_slots, cfg.n_kv_heads, self.capacity, cfg.head_dim)
    cache_spec = sharding.logical_to_mesh((None, None, "kv_heads", None, None), self.cache_shape, self.mesh)
    self.programs = Programs(nnx.graphdef(model), jax.tree.structure(state), self.capacity,
                             NamedSharding(self.mesh, cache_spec), config.attention_block, self._linears,
                             routes=config.record_routes and model.cfg.n_experts > 0)
    self._replicated = NamedSharding(self.mesh, P())

  @property
  def vocab_size(self) -> int:
    return self.model_config.vocab_size

  @property
  def cache_dtype(self) -> jnp.dtype:
    return cache_dtype(self.config.cache_dtype, self.devices[0].platform)

  def weights(self, state: nnx.State) -> Weights:
    """The engine's copy of a Decoder state: its leaves in the compute dtype where that is narrower (the
    forward casts every parameter to it before use, so the values it computes with are the same), moved
    into the engine's shardings with `jax.device_put` (from a learner's devices: device to device), the
    one-row copy laid out from them there, and ready when this returns. Nothing returned shares a buffer
    with `state`: a leaf that is neither cast nor moved is copied (the others are new arrays already), so
    the caller may then delete, donate or change `state`'s arrays."""
    by_path = self._leaves_by_path(state)
    narrowed = [jnp.issubdtype(by_path[p].dtype, jnp.floating) and by_path[p].dtype != self.weight_dtype
                for p in self._paths]
    leaves = jax.device_put([by_path[p].astype(self.weight_dtype) if n else by_path[p]
                             for p, n in zip(self._paths, narrowed)], self._shardings,
                            may_alias=[None if n else False for n in narrowed])
    one_row = [_laid_out(leaves[i], n, s) for i, (n, s) in zip(self._linears, self._one_row)]
    return jax.block_until_ready((leaves, one_row))

  def weight_bytes(self, weights: Weights) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(weights))

  def abstract_weights(self) -> list[jax.ShapeDtypeStruct]:
    """The weights' shapes, dtypes and shardings (for compiling ahead of time)."""
    dtype = lambda path: self.weight_dtype if jnp.issubdtype(self._dtypes[path], jnp.floating) else self._dtypes[path]
    leaves = [jax.ShapeDtypeStruct(self._shapes[p], dtype(p), sharding=s) for p, s in zip(self._paths, self._shardings)]
    one_row = [jax.ShapeDtypeStruct(engine_shape(leaves[i].shape, n), leaves[i].dtype, sharding=s)
               for i, (n, s) in zip(self._linears, self._one_row)]
    return leaves, one_row

  def abstract_cache(self) -> KVCache:
    one = jax.ShapeDtypeStruct(self.cache_shape, self.cache_dtype, sharding=self.programs.cache_sharding)
    return one, one

  def _leaves_by_path(self, new: nnx.State) -> dict[str, jax.Array]:
    """Refuses weights of another architecture (a mismatch would otherwise fail inside the engine thread).
    Paths and shapes only: variable metadata (e.g. a learner's sharding annotations) may differ."""
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree.flatten_with_path(new)[0]}
    if self._shapes.keys() != got.keys():
      missing, extra = sorted(self._shapes.keys() - got.keys()), sorted(got.keys() - self._shapes.keys())
      raise ValueError(f"update_params: the new state's parameters differ from the engine model's "
                       f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for path, shape in self._shapes.items():
      if got[path].shape != shape:
        raise ValueError(f"update_params: {path} has shape {got[path].shape}, expected {shape}")
    return got

  def init_cache(self) -> KVCache:
    zeros = jax.jit(lambda: jnp.zeros(self.cache_shape, self.cache_dtype),
                    out_shardings=self.programs.cache_sharding)
    return zeros(), zeros()

  def _put(self, tree):
    """Host rows onto the engine's devices (replicated), beside weights that may span several."""
    return jax.device_put(tree, self._replicated)

  def prefill(self, weights: Weights, cache: KVCache, chunks: list[PrefillChunk]
              ) -> tuple[KVCache, np.ndarray, np.ndarray, list[np.ndarray] | None]:
    """Writes each chunk's keys/values into its slot and samples the token that follows each chunk (by
    chunk; the first output token where a chunk ends its request's input); with routes, each chunk's
    tokens' expert ids [len(chunk), moe_layers, top_k]."""
    rows, cache_len = self.prefill_batch(chunks)
    cache, out_tokens, out_logprobs, routes = _prefill_program(self.programs, weights, cache, self._put(rows),
                                                               cache_len=cache_len, truncate=_truncates(chunks))
    out_tokens, out_logprobs, routes = jax.device_get((out_tokens, out_logprobs, routes))
    if routes is not None:
      routes = [routes[a, :len(c.tokens)] for a, c in enumerate(chunks)]
    return cache, out_tokens[:len(chunks)], out_logprobs[:len(chunks)], routes

  def prefill_batch(self, chunks: list[PrefillChunk]) -> tuple[PrefillRows, int]:
    """The prefill program's rows (on the host) and attention length. Padding rows write into slot 0 past
    max_seq_len."""
    b = bucket(len(chunks), 1, self.config.max_slots)
    t = bucket(max(len(c.tokens) for c in chunks), self.config.min_bucket, self.config.prefill_chunk)
    slots, starts = np.zeros(b, np.int32), np.full(b, self.capacity - t, np.int32)
    tokens, n_valid = np.zeros((b, t), np.int32), np.ones(b, np.int32)
    for a, c in enumerate(chunks):
      slots[a], starts[a], n_valid[a] = c.slot, c.start, len(c.tokens)
      tokens[a, :len(c.tokens)] = c.tokens
    reach = np.int32(max(c.start + len(c.tokens) for c in chunks) - 1)
    rows = PrefillRows(slots, tokens, starts, n_valid, reach, _sampling_rows(b, chunks))
    return rows, bucket(max(c.start for c in chunks) + t, self.config.min_bucket, self.capacity)

  def decode(self, weights: Weights, cache: KVCache, rows: list[DecodeRow], steps: int
             ) -> tuple[KVCache, list[np.ndarray], list[np.ndarray], list[np.ndarray] | None]:
    """Up to `steps` tokens for each row, fewer where it ends (a stop token, its remaining budget): per
    row, its tokens and their log-probs, and with routes the expert ids of the tokens it fed (the row's
    last token, then each sampled one but the last: as many as it sampled)."""
    batch, cache_len = self.decode_batch(rows, steps)
    cache, *out = _decode_program(self.programs, weights, cache, self._put(batch), cache_len=cache_len,
                                  steps=steps, truncate=_truncates(rows))
    out_tokens, out_logprobs, produced, routes = jax.device_get(out)
    per_row = lambda x: [x[a, :produced[a]] for a in range(len(rows))]
    return cache, per_row(out_tokens), per_row(out_logprobs), None if routes is None else per_row(routes)

  def decode_batch(self, rows: list[DecodeRow], steps: int) -> tuple[DecodeRows, int]:
    """The decode program's rows (on the host) and attention length. Only the running sequences are
    computed: the batch is padded to a power of two with rows that are over before they start."""
    n = bucket(len(rows), 1, self.config.max_running or self.config.max_slots)
    slots, tokens, positions = np.zeros(n, np.int32), np.zeros(n, np.int32), np.full(n, self.capacity - 1, np.int32)
    out_steps, remaining = np.zeros(n, np.int32), np.zeros(n, np.int32)
    stop_ids = np.full((n, bucket(max(len(r.params.stop_token_ids) for r in rows), STOP_BUCKET, 1 << 16)), -1,
                       np.int32)
    for a, r in enumerate(rows):
      slots[a], tokens[a], positions[a], out_steps[a], remaining[a] = r.slot, r.token, r.position, r.step, r.remaining
      stop_ids[a, :len(r.params.stop_token_ids)] = r.params.stop_token_ids
    batch = DecodeRows(slots, tokens, positions, out_steps, remaining, stop_ids, _sampling_rows(n, rows))
    # Row a writes positions position .. position + min(steps, remaining) - 1.
    reach = max(r.position + min(steps, r.remaining) for r in rows)
    return batch, bucket(reach, self.config.min_bucket, self.capacity)
