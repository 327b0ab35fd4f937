"""Routed experts as the remote engines return them (clawjax.routes), decoded into `RoutedExperts`.

SGLang (server started with `--enable-return-routed-experts`; request `return_routed_experts: true`,
optionally `routed_experts_start_len: S`): `meta_info.routed_experts` on the answer, or on the last chunk
of a stream only, is base64 of little-endian int32 [positions, layers, top_k], positions = prompt + output
- 1 - S, layers every decoder layer (dense ones included). The bytes carry no shape: the positions are
known from the call, top_k from the model (`routed_experts=TOP_K`, the backend option that asks for
them), the layers follow.
vLLM (server started with `--enable-return-routed-experts`; request `routed_experts_prompt_start: S`):
`choices[0].routed_experts` on a whole answer (not on stream chunks) is base64 of a `.npy` file (numpy's
format, which carries shape and dtype: uint8 / uint16 / int32) of [positions, layers, top_k].
An answer without routes is a generation without them; routes that cannot be decoded, or whose size does
not fit the call, are a BackendError naming the engine.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

from clawjax.routes import RoutedExperts, compact
from clawjax.serving.backends.base import BackendError


def _b64(value: Any, where: str) -> bytes:
  if not isinstance(value, str):
    raise BackendError(f"{where}: routed_experts is {type(value).__name__}, not base64 text")
  try:
    return base64.b64decode(value, validate=True)
  except (binascii.Error, ValueError) as e:
    raise BackendError(f"{where}: routed_experts is not base64 ({e})") from None


def _routes(ids: np.ndarray, start: int, computed: int, where: str) -> RoutedExperts:
  if ids.ndim != 3 or len(ids) != computed - start:
    raise BackendError(f"{where}: routed_experts of shape {ids.shape}, expected [{computed - start} positions "
                       f"(prompt + output - 1 - {start}), layers, top_k]")
  try:
    return RoutedExperts(start, compact(ids, f"{where}: routed_experts"))
  except ValueError as e:
    raise BackendError(str(e)) from None


def sglang_routes(meta: dict[str, Any], start: int, computed: int, top_k: int,
                  where: str = "sglang /generate") -> RoutedExperts | None:
  """The routes of a finished answer's meta_info (asked from position `start` on, for a call that computed
  `computed` positions, of a model choosing `top_k` experts a layer), or None when it holds none."""
  value = meta.get("routed_experts")
  if value is None:
    return None
  raw = _b64(value, where)
  positions = computed - start
  per_layer = positions * top_k * 4
  if per_layer <= 0 or len(raw) % per_layer:
    raise BackendError(f"{where}: routed_experts of {len(raw)} bytes is not int32 [{positions} positions, "
                       f"layers, {top_k}]")
  ids = np.frombuffer(raw, np.dtype("<i4")).reshape(positions, -1, top_k)
  return _routes(ids, start, computed, where)


def vllm_routes(choice: dict[str, Any], start: int, computed: int,
                where: str = "vllm /v1/completions") -> RoutedExperts | None:
  """The routes of a whole answer's first choice, or None when it holds none."""
  value = choice.get("routed_experts")
  if value is None:
    return None
  try:
    ids = np.load(io.BytesIO(_b64(value, where)), allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise BackendError(f"{where}: routed_experts is not a .npy array ({e})") from None
  return _routes(ids, start, computed, where)
