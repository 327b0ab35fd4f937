"""The rollout engine: continuous batching of concurrent requests over a slotted KV cache.

One background thread owns the model and the cache. Each loop iteration applies a pending weight update
(when allowed), admits every queued request that fits into free slots and prefills them together
(chunked; only the part of each input that the slot's retained prefix does not cover, see
prefix_cache.py), then runs one decode dispatch: up to k decode steps for every running slot, sampled
on the device (kv_forward.py), k = `decode_steps` while one request runs alone and `decode_steps_busy`
while several do. Requests come in from any thread (`submit`) or from asyncio (`generate`); either can
follow the tokens as they are sampled, a dispatch's run of tokens at a time (`on_tokens`: called on the
engine thread by `submit`, on the caller's event loop by `generate`, before the result is delivered).

The engine runs on its own devices (`devices` > 0: the last ones of this process; a learner in the same
process then trains on the others, and new weights move device to device by `jax.device_put`) or on the
first device, beside a learner there.

Policy versions: the initial weights are version `version` (0 by default) and every update adds 1, or sets
the version its caller names (a trainer names its RL step; a version never goes back). A request runs entirely on
the version it was admitted under. With update_mode "drain" an update waits until the requests in
flight finish (no new request is admitted meanwhile); with "abort" the requests in flight end at once
with finish_reason "abort" and the tokens sampled so far, all from the old version.

A caller may give up at any time: cancelling the future `submit` returned (or the `generate` awaiting it,
as `asyncio.wait_for` does on its timeout) drops the request at its next step, queued or running: its slot
is freed (what it wrote stays as a retained prefix), nothing more is decoded for it, nothing is set on its
future. A token callback that raises (a streaming caller whose event loop has closed) ends its own request
with an EngineError; the engine serves on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from flax import nnx

from clawjax.engine.kv_forward import DecodeRow, KVRunner, PrefillChunk, bucket
from clawjax.engine.placement import engine_devices
from clawjax.engine.prefix_cache import SlotPrefixCache
from clawjax.generation import SamplingParams, TokenSink  # every field of SamplingParams is honoured

# A run of sampled tokens of one request and their log-probs, as one dispatch produced them.
TokensCallback = Callable[[tuple[int, ...], tuple[float, ...]], None]


CACHE_DTYPES = ("auto", "float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  max_slots: int = 8  # sequences whose keys/values are kept: running ones plus retained prefixes
  max_running: int = 0  # sequences decoded together at most; 0: max_slots (more slots = more prefix reuse)
  max_seq_len: int = 4096  # input + output tokens of one sequence
  prefill_chunk: int = 512  # longest prefill step of one input; longer inputs are prefilled in chunks
  # Padded tokens (rows x chunk length) of one prefill dispatch: requests admitted together share
  # dispatches up to it (one chunk always fits); bounds the dispatch's attention scores.
  prefill_tokens: int = 2048
  min_bucket: int = 16  # shortest padded length; lengths round up to powers of two from here
  # Cached keys attended in one score array; longer reaches are read from the cache block by block (online
  # softmax), up to the last block a query reaches.
  attention_block: int = 512
  # Decode steps per dispatch (k): `decode_steps` while one request runs alone (its tokens stream in runs
  # of k: keep it small for a lone streamed answer), `decode_steps_busy` while several run (fewer host
  # round trips per token under load). A request that ends mid-dispatch idles its slot for the rest.
  decode_steps: int = 8
  decode_steps_busy: int = 16
  # KV cache dtype. "auto": float32 on CPU (log-probs equal the learner's to float32 rounding), bfloat16
  # on GPU / TPU (half the cache's memory and reads; exact when the model computes in bfloat16, else a
  # small log-prob gap, BENCHMARKS.md).
  cache_dtype: str = "auto"
  # A second copy of the dense Linears laid out [outputs, inputs], read by dispatches of one row (a
  # request decoding alone): XLA's CPU matrix-vector product over it is ~1.3 x faster, while its products of
  # 2-32 rows are slower than over the model's layout, which every other dispatch reads. "auto": on for
  # CPU, off for GPU / TPU (their memory holds the weights once); "on" / "off".
  one_row_copy: str = "auto"
  # Devices of the engine's own: the last `devices` of this process's, weights split over them
  # (tensor parallelism); a learner in the process trains on the others and new weights move device to
  # device. 0: the first device, shared with a learner there.
  devices: int = 0
  update_mode: Literal["drain", "abort"] = "drain"  # what a weight update does to requests in flight
  max_queue: int = 4096  # queued requests beyond this are refused as overloaded
  seed: int = 0  # PRNG seed for requests that bring none
  # A MoE model's expert choices of every position a request computes, returned with its result
  # (`Result.routed_experts`) for rollout routing replay: prompt positions from the prefill or, on a
  # prefix-cache hit, the routes stored with the cached tokens; each sampled token but the last from the
  # decode dispatch that fed it. Off: the programs compute and fetch nothing of it.
  record_routes: bool = False

  def __post_init__(self):
    if self.update_mode not in ("drain", "abort"):
      raise ValueError(f"EngineConfig.update_mode={self.update_mode!r}: expected 'drain' or 'abort'")
    if self.one_row_copy not in ("auto", "on", "off"):
      raise ValueError(f"EngineConfig.one_row_copy={self.one_row_copy!r}: expected 'auto', 'on' or 'off'")
    if self.cache_dtype not in CACHE_DTYPES:
      raise ValueError(f"EngineConfig.cache_dtype={self.cache_dtype!r}: expected one of {CACHE_DTYPES}")
    for name in ("max_slots", "max_seq_len", "prefill_chunk", "prefill_tokens", "min_bucket", "attention_block",
                 "decode_steps", "decode_steps_busy", "max_queue"):
      if getattr(self, name) < 1:
        raise ValueError(f"EngineConfig.{name}={getattr(self, name)}: must be >= 1")
    if self.devices < 0:
      raise ValueError(f"EngineConfig.devices={self.devices}: must be >= 0")
    if not 0 <= self.max_running <= self.max_slots:
      raise ValueError(f"EngineConfig.max_running={self.max_running}: must be in [0, max_slots={self.max_slots}]")


@dataclasses.dataclass(frozen=True)
class Result:
  output_ids: tuple[int, ...]
  output_logprobs: tuple[float, ...]
  finish_reason: str  # "stop" | "length" | "abort"
  policy_version: int
  prompt_tokens: int
  cached_tokens: int  # input tokens whose keys/values came from the prefix cache
  # With record_routes: the MoE layers' expert ids of every position the request computed (or reused),
  # [prompt_tokens + len(output_ids) - 1, moe_layers, top_k] (clawjax.routes); None otherwise.
  routed_experts: np.ndarray | None = None


class EngineError(Exception):
  """A refused request. status: HTTP-like (400 bad input, 503 overloaded or shut down)."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class _Request:
  input_ids: np.ndarray
  sampling: SamplingParams
  key_data: np.ndarray  # uint32 raw PRNG key of this request
  future: concurrent.futures.Future
  slot: int = -1
  version: int = -1
  cached_tokens: int = 0
  prefilled: int = 0  # input tokens past the cached ones whose keys/values are written
  output_ids: list[int] = dataclasses.field(default_factory=list)
  output_logprobs: list[float] = dataclasses.field(default_factory=list)
  on_tokens: TokensCallback | None = None
  # With record_routes: the routes of its positions so far, in runs; None when not recorded (or the prefix
  # it reused had none).
  routes: list[np.ndarray] | None = None

  def routes_so_far(self) -> np.ndarray | None:
    return np.concatenate(self.routes) if self.routes else None

  @property
  def unwritten(self) -> int:
    """Position of the first input token whose keys/values are not written yet."""
    return self.cached_tokens + self.prefilled

  def remaining(self, max_seq_len: int) -> int:
    """Tokens it may still produce: within max_new_tokens and the engine's max_seq_len."""
    out = len(self.output_ids)
    return min(self.sampling.max_new_tokens - out, max_seq_len - len(self.input_ids) - out)


@dataclasses.dataclass
class Stats:
  """Counters since the engine started."""
  decode_dispatches: int = 0
  prefill_dispatches: int = 0
  tokens_decoded: int = 0  # output tokens sampled by decode dispatches (a request's first comes from its prefill)
  tokens_prefilled: int = 0  # input tokens computed by prefills (not those reused from the prefix cache)


@dataclasses.dataclass
class _Update:
  weights: Any
  done: concurrent.futures.Future
  version: int | None = None  # None: the current version + 1


def _key_data(seed: int) -> np.ndarray:
  """The raw threefry key of a 64-bit seed (taken mod 2**64): equal to jax.random.key(seed) below 2**32."""
  seed %= 2**64
  return np.array([seed >> 32, seed & 0xFFFFFFFF], np.uint32)


class Engine:
  """Batched KV-cache generation with one model; thread-safe; call `close()` when done. The engine keeps
  copies of `model`'s weights (as `update_params` does), never its arrays: the model may be changed,
  deleted or donated afterwards."""

  def __init__(self, model, config: EngineConfig = EngineConfig(), version: int = 0):
    self.config = config
    self.runner = KVRunner(model, config, engine_devices(config.devices))
    self._weights = self.runner.weights(nnx.state(model))
    self._stats = Stats()
    self.version = version
    self._cache = self.runner.init_cache()
    self._prefix = SlotPrefixCache(config.max_slots)
    self._slots: list[_Request | None] = [None] * config.max_slots
    self._max_running = config.max_running or config.max_slots
    self._queue: deque[_Request] = deque()
    self._updates: deque[_Update] = deque()
    self._flush_requested = False
    self._abort_requested = False
    self._cv = threading.Condition()
    self._closed = False
    self._rng = np.random.default_rng(config.seed)
    self._thread = threading.Thread(target=self._loop, name="clawjax-engine", daemon=True)
    self._thread.start()

  # ---- public API (any thread) ----

  def submit(self, input_ids, sampling: SamplingParams,
             on_tokens: TokensCallback | None = None) -> concurrent.futures.Future:
    """Queues a request; the future resolves to a Result or raises EngineError. `on_tokens(ids,
    logprobs)` is called on the engine thread with each dispatch's run of sampled tokens, before the
    future resolves; it must be quick (it holds up every running sequence), and if it raises, the request
    ends with an EngineError. `future.cancel()` succeeds until the result is set, and drops the request at
    its next step (the module docstring)."""
    tokens = self._check_request(input_ids, sampling)
    seed = sampling.seed if sampling.seed is not None else int(self._rng.integers(2**63))
    req = _Request(tokens, sampling, _key_data(seed), concurrent.futures.Future(), on_tokens=on_tokens)
    with self._cv:
      if self._closed:
        raise EngineError("engine is shut down", status=503)
      if len(self._queue) >= self.config.max_queue:  # requests given up while queued leave room first
        self._queue = deque(r for r in self._queue if not r.future.cancelled())
      if len(self._queue) >= self.config.max_queue:
        raise EngineError(f"queue full ({self.config.max_queue} requests)", status=503)
      self._queue.append(req)
      self._cv.notify()
    return req.future

  def submit_batch(self, requests: Sequence[tuple[Any, SamplingParams]]) -> list[concurrent.futures.Future]:
    """`submit` for each (input_ids, sampling) pair, all queued before the engine thread looks at the queue
    again (it takes the queue under the same lock): requests that arrive together are admitted in one step,
    as far as slots allow, however busy the machine is. On an error nothing after the failing request is
    queued; those before it stay queued."""
    with self._cv:
      return [self.submit(ids, sampling) for ids, sampling in requests]

  async def generate(self, input_ids, sampling: SamplingParams,
                     on_tokens: TokenSink | None = None) -> Result:
    """`submit` from asyncio; `on_tokens(ids)` runs on this event loop for each run of sampled tokens,
    all of them before the result is delivered (both travel through the loop's queue, in order)."""
    forward = None
    if on_tokens is not None:
      loop = asyncio.get_running_loop()
      forward = lambda ids, logprobs: loop.call_soon_threadsafe(on_tokens, ids)
    return await asyncio.wrap_future(self.submit(input_ids, sampling, forward))

  def update_params(self, state, version: int | None = None) -> int:
    """Replaces the weights with `state` (an nnx.State of the same model); returns the new version:
    `version` (not below the current one: the same one replaces the weights a version stands for, as a
    trainer does when it first hands its weights to an engine), or the current one + 1.

    Blocks until the update is applied (see the module docstring for requests in flight). The weights are
    copied into the engine's layout and devices here, in the caller's thread (`KVRunner.weights`: from a
    learner on other devices of this process, device to device; on the same devices, a copy of every
    array the engine would otherwise share with `state`); `state` is not modified, and its arrays may be
    deleted or donated once this returns.
    """
    if version is not None and version < self.version:
      raise EngineError(f"weight version {version} is below the engine's {self.version}")
    weights = self.runner.weights(state)
    done: concurrent.futures.Future = concurrent.futures.Future()
    with self._cv:
      if self._closed:
        raise EngineError("engine is shut down", status=503)
      self._updates.append(_Update(weights, done, version))
      self._cv.notify()
    return done.result()

  def update_from_model(self, model, version: int | None = None) -> int:
    return self.update_params(nnx.state(model), version)

  def flush_cache(self) -> None:
    """Forgets every retained prefix (takes effect before the next admission)."""
    with self._cv:
      self._flush_requested = True
      self._cv.notify()

  def abort_all(self) -> None:
    """Ends every request queued or running when the engine next steps, with finish_reason "abort" and
    the tokens sampled so far (SGLang's abort_all)."""
    with self._cv:
      self._abort_requested = True
      self._cv.notify()

  @property
  def alive(self) -> bool:
    return self._thread.is_alive() and not self._closed

  def stats(self) -> dict[str, int]:
    """queued, running, version, and the `Stats` counters."""
    with self._cv:
      return {"queued": len(self._queue), "running": sum(r is not None for r in self._slots),
              "version": self.version, **dataclasses.asdict(self._stats)}

  def close(self) -> None:
    with self._cv:
      self._closed = True
      self._cv.notify()
    self._thread.join()

  # ---- engine thread ----

  def _check_request(self, input_ids, sampling: SamplingParams) -> np.ndarray:
    tokens = np.asarray(input_ids)
    if tokens.ndim != 1 or len(tokens) == 0 or not np.issubdtype(tokens.dtype, np.integer):
      raise EngineError("input_ids must be a non-empty list of integers")
    vocab = self.runner.vocab_size
    if tokens.min() < 0 or tokens.max() >= vocab:
      raise EngineError(f"input_ids: token id out of range [0, {vocab})")
    if len(tokens) >= self.config.max_seq_len:
      raise EngineError(f"input_ids: {len(tokens)} tokens, the engine's max_seq_len is "
                        f"{self.config.max_seq_len} (input + output)")
    if sampling.max_new_tokens < 1:
      raise EngineError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1:
      raise EngineError(f"temperature must be >= 0 and top_p in (0, 1]; got {sampling}")
    return tokens.astype(np.int32)

  def _loop(self) -> None:
    try:
      while True:
        with self._cv:
          while not (self._closed or self._queue or self._updates or self._flush_requested
                     or self._abort_requested or any(self._slots)):
            self._cv.wait()
          if self._closed:
            break
        self._drop_given_up()  # before a drain waits for them, and to free their slots for admission
        self._apply_control()
        self._admit()
        self._drop_given_up()  # (given up while the admission's prefill ran)
        if any(self._slots):
          self._decode()
    except BaseException as e:  # The engine is dead: fail everything rather than hang callers.
      self._fail_all(EngineError(f"engine failed: {e!r}", status=500))
      raise
    self._fail_all(EngineError("engine is shut down", status=503))

  def _fail_all(self, err: EngineError) -> None:
    with self._cv:
      self._closed = True
      pending = [r for r in self._slots if r is not None] + list(self._queue)
      updates = list(self._updates)
      self._queue.clear()
      self._updates.clear()
    for r in pending:
      _deliver(r.future, error=err)
    for u in updates:
      u.done.set_exception(err)

  def _apply_control(self) -> None:
    with self._cv:
      flush, self._flush_requested = self._flush_requested, False
      abort, self._abort_requested = self._abort_requested, False
      queued = [self._queue.popleft() for _ in range(len(self._queue))] if abort else []
      update = self._updates[0] if self._updates else None
    if flush:
      self._prefix.flush()
    if abort:
      self._abort(queued)
    if update is None:
      return
    if any(self._slots):
      if self.config.update_mode == "drain":
        return
      self._abort([])
    with self._cv:
      self._updates.popleft()
      self._weights = update.weights
      self.version = self.version + 1 if update.version is None else update.version
    self._prefix.flush()
    update.done.set_result(self.version)

  def _abort(self, queued: list[_Request]) -> None:
    """Ends `queued` (taken off the queue) and every running request with finish_reason "abort"."""
    for req in queued:
      _deliver(req.future, Result((), (), "abort", self.version, len(req.input_ids), 0))
    for slot, req in enumerate(self._slots):
      if req is not None:
        self._finish(slot, "abort")

  def _admit(self) -> None:
    with self._cv:
      free = [s for s, r in enumerate(self._slots) if r is None]
      room = min(len(free), self._max_running - (len(self._slots) - len(free)), len(self._queue))
      # A pending flush or update goes first: it was asked for before the requests queued after it.
      if self._updates or self._flush_requested:
        room = 0
      admitted = []
      while len(admitted) < room and self._queue:
        req = self._queue.popleft()
        if not req.future.cancelled():
          admitted.append(req)
    for req in admitted:
      self._place(req, free)
    try:
      self._prefill(admitted)
    except Exception as e:
      for req in admitted:
        _deliver(req.future, error=EngineError(f"prefill failed: {e!r}", status=500))
      raise

  def _place(self, req: _Request, free: list[int]) -> None:
    """Gives the request the free slot holding the longest prefix of its input."""
    slot, reuse = self._prefix.choose(req.input_ids, free)
    free.remove(slot)
    # The last input token is always recomputed: its logits give the first output token.
    req.slot, req.version, req.cached_tokens = slot, self.version, min(reuse, len(req.input_ids) - 1)
    self._slots[slot] = req
    if self.runner.programs.routes:  # the reused tokens' routes are those stored with them
      cached = self._prefix.routes(slot)
      if cached is not None:
        req.routes = [cached[:req.cached_tokens]]
      elif not req.cached_tokens:
        req.routes = []
    # Until the prefill completes, only the reused part of the slot is trustworthy.
    self._prefix.set(slot, req.input_ids[:req.cached_tokens], req.routes_so_far())

  def _prefill(self, requests: list[_Request]) -> None:
    """Prefills the requests' inputs past their cached prefixes, a chunk of each of several requests per
    dispatch (up to `prefill_tokens` padded tokens), and takes each one's first output token."""
    cfg = self.config
    pending = list(requests)
    while pending:
      group: list[tuple[_Request, int]] = []
      for req in pending:
        size = min(cfg.prefill_chunk, len(req.input_ids) - req.unwritten)
        longest = max([size] + [n for _, n in group])
        padded = bucket(len(group) + 1, 1, cfg.max_slots) * bucket(longest, cfg.min_bucket, cfg.prefill_chunk)
        if group and padded > cfg.prefill_tokens:
          break
        group.append((req, size))
      chunks = [PrefillChunk(req.slot, req.input_ids[req.unwritten:req.unwritten + size], req.unwritten, req.key_data,
                             req.sampling) for req, size in group]
      self._cache, tokens, logprobs, routes = self.runner.prefill(self._weights, self._cache, chunks)
      self._stats.prefill_dispatches += 1
      for k, ((req, size), token, logprob) in enumerate(zip(group, tokens, logprobs)):
        self._stats.tokens_prefilled += size
        req.prefilled += size
        if req.routes is not None:
          req.routes.append(routes[k])
        if req.unwritten == len(req.input_ids):
          self._prefix.set(req.slot, req.input_ids, req.routes_so_far())
          self._take(req.slot, [token], [logprob])
      # A request given up mid-prefill stops here; its slot is freed at the next step.
      pending = [req for req in pending if req.unwritten < len(req.input_ids) and not req.future.cancelled()]

  def _decode(self) -> None:
    running = [(s, r) for s, r in enumerate(self._slots) if r is not None]
    steps = self.config.decode_steps if len(running) == 1 else self.config.decode_steps_busy
    rows = [DecodeRow(s, r.output_ids[-1], len(r.input_ids) + len(r.output_ids) - 1, r.key_data, len(r.output_ids),
                      r.remaining(self.config.max_seq_len), r.sampling) for s, r in running]
    self._cache, tokens, logprobs, routes = self.runner.decode(self._weights, self._cache, rows, steps)
    self._stats.decode_dispatches += 1
    for k, ((slot, _), run, run_logprobs) in enumerate(zip(running, tokens, logprobs)):
      self._stats.tokens_decoded += len(run)
      self._take(slot, run, run_logprobs, None if routes is None else routes[k])

  def _take(self, slot: int, tokens, logprobs, fed_routes: np.ndarray | None = None) -> None:
    """Appends a run of sampled tokens to the slot's request (the device ended the run where the request
    ends: at its first stop token or at its length limit) and finishes the request if it has ended.
    `fed_routes`: the routes of the tokens the run's steps fed (a decode's)."""
    req = self._slots[slot]
    run, run_logprobs = tuple(map(int, tokens)), tuple(map(float, logprobs))
    req.output_ids.extend(run)
    req.output_logprobs.extend(run_logprobs)
    if req.routes is not None and fed_routes is not None:
      req.routes.append(fed_routes)
    if req.on_tokens is not None and run and not req.future.cancelled():
      try:
        req.on_tokens(run, run_logprobs)
      except Exception as e:  # pylint: disable=broad-except  (the caller's failure ends its request only)
        self._release(slot)
        _deliver(req.future, error=EngineError(f"the request's token callback failed: {e!r}", status=500))
        return
    # Keys/values exist for every token except the last one sampled (it is fed in the next step).
    if run and run[-1] in req.sampling.stop_token_ids:
      self._finish(slot, "stop")
    elif req.remaining(self.config.max_seq_len) <= 0:
      self._finish(slot, "length")

  def _finish(self, slot: int, reason: str) -> None:
    req = self._release(slot)
    _deliver(req.future, Result(
        output_ids=tuple(req.output_ids), output_logprobs=tuple(req.output_logprobs),
        finish_reason=reason, policy_version=req.version, prompt_tokens=len(req.input_ids),
        cached_tokens=req.cached_tokens, routed_experts=req.routes_so_far()))

  def _drop_given_up(self) -> None:
    """Frees the slots of running requests whose callers cancelled them (queued ones are skipped at
    admission)."""
    for slot, req in enumerate(self._slots):
      if req is not None and req.future.cancelled():
        self._release(slot)

  def _release(self, slot: int) -> _Request:
    """Frees the slot; the keys/values its request wrote stay there as a retained prefix (every token's
    but the last one sampled, which is fed in the next step)."""
    req = self._slots[slot]
    self._slots[slot] = None
    if req.output_ids:
      written = np.concatenate([req.input_ids, np.asarray(req.output_ids[:-1], np.int32)])
    else:  # given up before its prefill completed
      written = req.input_ids[:req.unwritten]
    routes = req.routes_so_far()
    self._prefix.set(slot, written, None if routes is None else routes[:len(written)])
    return req


def _deliver(future: concurrent.futures.Future, result: Result | None = None,
             error: EngineError | None = None) -> None:
  """Sets a request's outcome unless its caller cancelled it, which may happen at any moment (even between
  a check and the set: only the set itself can tell)."""
  try:
    if error is None:
      future.set_result(result)
    else:
      future.set_exception(error)
  except concurrent.futures.InvalidStateError:
    pass
