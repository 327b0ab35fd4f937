"""KV-cache prefill and decode for the `clawjax.models` Decoder, jitted with bucketed static shapes.

The cache holds keys and values of shape [layers, slots, capacity, kv_heads, head_dim], where
capacity = max_seq_len + prefill_chunk: the margin absorbs the padding of a bucketed prefill chunk and is
where the padding rows of a decode batch write, so padding never lands on a retained prefix. Attention
reads only the first `cache_len` positions, a power of two (>= min_bucket) covering every query, and a
decode batch holds only the running sequences, padded to a power of two: the number of compiled programs
grows with log(max_seq_len) * log(max_running), not with the lengths and loads seen. The layers run as
one `lax.scan` over stacked weights, so each compilation costs one layer.

Both programs sample in the same jit (sampling.py): a row's PRNG key is fold_in(request key, index of the
output token), so a request's draws do not depend on the batch it shares.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax.engine import sampling
from clawjax.models.attention import masked_attention

KVCache = tuple[jax.Array, jax.Array]  # keys, values: [layers, slots, capacity, kv_heads, head_dim]


def bucket(n: int, minimum: int, maximum: int) -> int:
  """The smallest power of two >= max(n, minimum), capped at `maximum`."""
  return min(maximum, max(minimum, 1 << max(0, n - 1).bit_length()))


@dataclasses.dataclass(frozen=True)
class Programs:
  """Static structure of the engine's model: the graph without its layers, and one layer's graph."""
  graphdef: nnx.GraphDef
  layer_graphdef: nnx.GraphDef
  n_layers: int


def split_weights(model) -> tuple[nnx.State, nnx.State]:
  """(layer weights stacked on a leading layer axis, every other weight): the layers run as one
  `lax.scan`, so compiling a program costs one layer, not n_layers."""
  _, layers, rest = nnx.split(model, nnx.PathContains("layers"), ...)
  per_layer = [layers["layers"][i] for i in range(len(model.layers))]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer), rest


def _model(programs: Programs, stacked: nnx.State, rest: nnx.State):
  """The whole Decoder (for embed / final_norm / logits); its layer slices are dead code, removed by XLA."""
  per_layer = nnx.State({"layers": nnx.State(
      {i: jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(programs.n_layers)})})
  return nnx.merge(programs.graphdef, per_layer, rest)


def _layers_with_cache(programs: Programs, stacked: nnx.State, x_BTD: jax.Array, positions_BT: jax.Array,
                       cache: KVCache, write, read, cache_len: int) -> tuple[jax.Array, KVCache]:
  """Runs every decoder layer: new keys/values go into the cache through `write(cache, layer, new_BTKH)`,
  then the queries attend causally (by position) to `read(cache, layer)`: [B, cache_len, kv_heads, head_dim]."""
  mask_BTS = jnp.arange(cache_len)[None, None, :] <= positions_BT[:, :, None]

  def one_layer(carry, xs):
    x_BTD, k_cache, v_cache = carry
    layer_state, i = xs
    layer = nnx.merge(programs.layer_graphdef, layer_state)
    q_BTNH, k_BTKH, v_BTKH = layer.attn.project_qkv(layer.attn_norm(x_BTD), positions_BT)
    k_cache, v_cache = write(k_cache, i, k_BTKH), write(v_cache, i, v_BTKH)
    o_BTNH = masked_attention(q_BTNH, read(k_cache, i).astype(q_BTNH.dtype),
                              read(v_cache, i).astype(q_BTNH.dtype), mask_BTS)
    x_BTD = x_BTD + layer.attn.project_out(o_BTNH)
    x_BTD = x_BTD + layer.mlp(layer.mlp_norm(x_BTD))
    return (x_BTD, k_cache, v_cache), None

  (x_BTD, k_cache, v_cache), _ = jax.lax.scan(one_layer, (x_BTD, *cache),
                                              (stacked, jnp.arange(programs.n_layers)))
  return x_BTD, (k_cache, v_cache)


def _row_keys(key_data_B2: jax.Array, steps_B: jax.Array) -> jax.Array:
  return jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(key_data_B2), steps_B)


# Module-level jitted programs: engines over the same architecture share compilations.
@functools.partial(jax.jit, static_argnames=("programs", "cache_len"), donate_argnums=(2,))
def _prefill_program(programs, weights, cache, slot, tokens_1T, start, n_valid, key_data_2, temperature, top_k,
                     top_p, *, cache_len: int):
  stacked, rest = weights
  model = _model(programs, stacked, rest)
  positions_1T = start + jnp.arange(tokens_1T.shape[1], dtype=jnp.int32)[None]

  def write(cache, i, new_1TKH):
    return jax.lax.dynamic_update_slice(cache, new_1TKH[None].astype(cache.dtype), (i, slot, start, 0, 0))

  def read(cache, i):
    return jax.lax.dynamic_slice(cache, (i, slot, 0, 0, 0), (1, 1, cache_len) + cache.shape[3:])[0]

  x_1TD, cache = _layers_with_cache(programs, stacked, model.embed(tokens_1T), positions_1T, cache, write, read,
                                    cache_len)
  last_1D = jax.lax.dynamic_index_in_dim(x_1TD[0], n_valid - 1, keepdims=True)
  logits_1V = model.logits(model.final_norm(last_1D))
  tokens_1, logprobs_1 = sampling.sample(logits_1V, _row_keys(key_data_2[None], jnp.zeros(1, jnp.int32)),
                                         temperature[None], top_k[None], top_p[None])
  return cache, tokens_1[0], logprobs_1[0]


@functools.partial(jax.jit, static_argnames=("programs", "cache_len"), donate_argnums=(2,))
def _decode_program(programs, weights, cache, slots_A, tokens_A, positions_A, key_data_A2, steps_A,
                    temperature_A, top_k_A, top_p_A, *, cache_len: int):
  """One token for each of A rows; row a continues the sequence held in cache slot slots_A[a]."""
  stacked, rest = weights
  model = _model(programs, stacked, rest)

  def write(cache, i, new_A1KH):
    return cache.at[i, slots_A, positions_A].set(new_A1KH[:, 0].astype(cache.dtype))

  def read(cache, i):
    return cache[i, slots_A, :cache_len]

  x_A1D, cache = _layers_with_cache(programs, stacked, model.embed(tokens_A[:, None]), positions_A[:, None],
                                    cache, write, read, cache_len)
  logits_AV = model.logits(model.final_norm(x_A1D[:, 0]))
  tokens_A, logprobs_A = sampling.sample(logits_AV, _row_keys(key_data_A2, steps_A), temperature_A, top_k_A,
                                         top_p_A)
  return cache, tokens_A, logprobs_A


class KVRunner:
  """Prefill and decode for one model architecture and engine configuration (host-side batching)."""

  def __init__(self, model, config):
    self.model_config = model.cfg
    self.config = config
    self.capacity = config.max_seq_len + config.prefill_chunk
    layer_defs = {nnx.graphdef(layer) for layer in model.layers}
    if len(layer_defs) != 1:
      raise ValueError("KVRunner: the engine scans over layers, so every layer must have the same structure "
                       f"(this model has {len(layer_defs)} kinds, e.g. MoE and dense layers mixed)")
    graphdef, _, _ = nnx.split(model, nnx.PathContains("layers"), ...)
    self.programs = Programs(graphdef, layer_defs.pop(), len(model.layers))
    self._full_graphdef = nnx.graphdef(model)
    self.device = jax.local_devices()[0]  # (in a multi-process run, global device 0 is process 0's)
    self._template = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), nnx.state(model))

  @property
  def vocab_size(self) -> int:
    return self.model_config.vocab_size

  def weights(self, state: nnx.State) -> tuple[nnx.State, nnx.State]:
    """The engine's layout of a Decoder state (see `split_weights`), after checking its structure."""
    self.check_state(state)
    # A learner's state may be sharded over a mesh; the engine runs on one device, beside its cache.
    state = jax.device_put(state, self.device)
    return split_weights(nnx.merge(self._full_graphdef, state))

  def check_state(self, new: nnx.State) -> None:
    """Refuses weights of another architecture (a mismatch would otherwise fail inside the engine thread)."""
    # Paths and shapes only: variable metadata (e.g. a learner's sharding annotations) may differ.
    shapes = lambda tree: {jax.tree_util.keystr(p): x.shape for p, x in jax.tree.flatten_with_path(tree)[0]}
    want, got = shapes(self._template), shapes(new)
    if want.keys() != got.keys():
      missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
      raise ValueError(f"update_params: the new state's parameters differ from the engine model's "
                       f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for path, shape in want.items():
      if got[path] != shape:
        raise ValueError(f"update_params: {path} has shape {got[path]}, expected {shape}")

  def init_cache(self) -> KVCache:
    cfg = self.model_config
    shape = (cfg.n_layers, self.config.max_slots, self.capacity, cfg.n_kv_heads, cfg.head_dim)
    zeros = jnp.zeros(shape, jnp.dtype(self.config.cache_dtype), device=self.device)
    return zeros, jnp.copy(zeros)

  def prefill(self, weights, cache: KVCache, slot: int, tokens: np.ndarray, start: int, key_data: np.ndarray,
              params) -> tuple[KVCache, jax.Array, jax.Array]:
    """Writes keys/values of `tokens` at positions start.. of `slot`; samples the token that follows."""
    n = len(tokens)
    t = bucket(n, self.config.min_bucket, self.config.prefill_chunk)
    padded = np.zeros((1, t), np.int32)
    padded[0, :n] = tokens
    cache_len = bucket(start + t, self.config.min_bucket, self.capacity)
    return _prefill_program(self.programs, weights, cache, np.int32(slot), padded, np.int32(start), np.int32(n),
                            key_data, np.float32(params.temperature), np.int32(params.top_k),
                            np.float32(params.top_p), cache_len=cache_len)

  def decode(self, weights, cache: KVCache, rows: list[tuple[int, int, int, np.ndarray, int, object]]
             ) -> tuple[KVCache, np.ndarray, np.ndarray]:
    """One token for each row: (slot, last token, its position, key data, output index, sampling params).

    Only the running sequences are computed: the batch is padded to a power of two with rows that write
    into slot 0 past max_seq_len, where no valid key/value ever lives. Returns tokens/log-probs by row.
    """
    n = bucket(len(rows), 1, self.config.max_running or self.config.max_slots)
    slots, tokens, positions = np.zeros(n, np.int32), np.zeros(n, np.int32), np.full(n, self.capacity - 1, np.int32)
    key_data, steps = np.zeros((n, 2), np.uint32), np.zeros(n, np.int32)
    temperature, top_k, top_p = np.zeros(n, np.float32), np.zeros(n, np.int32), np.ones(n, np.float32)
    for a, (slot, token, pos, kd, step, params) in enumerate(rows):
      slots[a], tokens[a], positions[a], key_data[a], steps[a] = slot, token, pos, kd, step
      temperature[a], top_k[a], top_p[a] = params.temperature, params.top_k, params.top_p
    cache_len = bucket(max(r[2] for r in rows) + 1, self.config.min_bucket, self.capacity)
    cache, out_tokens, out_logprobs = _decode_program(self.programs, weights, cache, slots, tokens, positions,
                                                      key_data, steps, temperature, top_k, top_p,
                                                      cache_len=cache_len)
    return cache, np.asarray(out_tokens)[:len(rows)], np.asarray(out_logprobs)[:len(rows)]
