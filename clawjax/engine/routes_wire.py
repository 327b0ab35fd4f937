"""Recorded routes in SGLang's wire format, for `python -m clawjax.engine` (server.py).

SGLang (`--enable-return-routed-experts`; a request's `return_routed_experts: true`, optionally
`routed_experts_start_len: S`) answers `meta_info.routed_experts`: base64 of little-endian int32
[prompt + output - 1 - S, layers, top_k], every decoder layer included (a dense layer's rows hold zeros
here). The engine records the MoE layers' only (clawjax.routes); this puts them at their layers' places.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from clawjax.models.config import ModelConfig


class RoutesRequest:
  """What a /generate body asks of routes: whether any, and from which position."""

  def __init__(self, body: dict[str, Any], where: str = "request"):
    self.wanted = bool(body.get("return_routed_experts"))
    start = body.get("routed_experts_start_len", 0)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
      raise ValueError(f"{where}.routed_experts_start_len: expected a non-negative integer, got {start!r}")
    self.start = start


def sglang_routed_experts(routes_PLK: np.ndarray, start: int, cfg: ModelConfig) -> str:
  """`routes_PLK` (the MoE layers' ids of every computed position) from `start` on, as SGLang sends them."""
  moe = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
  held = routes_PLK[min(start, len(routes_PLK)):]
  out = np.zeros((len(held), cfg.n_layers, routes_PLK.shape[-1]), "<i4")
  out[:, moe] = held
  return base64.b64encode(out.tobytes()).decode("ascii")
