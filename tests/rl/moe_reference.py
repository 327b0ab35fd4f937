"""An independent float64 numpy forward of a Qwen3-MoE Decoder over one causal sequence, whose MoE layers
take forced expert ids where given: the reference routing replay is checked against. Written from the
architecture (HF Qwen3-MoE), reading only the model's parameters: none of clawjax's model code runs."""
from __future__ import annotations

import numpy as np

from clawjax.models.model import Decoder


def _p(x) -> np.ndarray:
  return np.asarray(x[...], np.float64)


def _rms(x: np.ndarray, scale, eps: float) -> np.ndarray:
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _p(scale)


def _rope(x_TNH: np.ndarray, theta: float) -> np.ndarray:
  t, _, h = x_TNH.shape
  inv = theta ** (-np.arange(0, h, 2) / h)
  ang = np.arange(t)[:, None] * inv[None]
  cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]
  x1, x2 = x_TNH[..., :h // 2], x_TNH[..., h // 2:]
  return x_TNH * cos + np.concatenate([-x2, x1], -1) * sin


def _softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def forward(model: Decoder, tokens: np.ndarray, forced_TLK: np.ndarray | None = None,
            replay_T: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
  """(log-probs [T, vocab] of the next token at each position, each MoE layer's experts [T, top_k]), with
  MoE layer l's ids forced to forced_TLK[:, l] where replay_T; the weights then are the softmax over all
  experts at the forced ids, renormalised when the model's norm_topk_prob."""
  cfg = model.cfg
  t = len(tokens)
  x = _p(model.embedding)[tokens]
  causal = np.tril(np.ones((t, t), bool))
  experts_used, moe = [], 0
  for layer in model.layers:
    a = layer.attn
    h = _rms(x, layer.attn_norm.scale, cfg.rms_eps)
    q, k, v = (np.einsum("td,dnh->tnh", h, _p(w)) for w in (a.q_proj, a.k_proj, a.v_proj))
    if cfg.qk_norm:
      q, k = _rms(q, a.q_norm.scale, cfg.rms_eps), _rms(k, a.k_norm.scale, cfg.rms_eps)
    q, k = _rope(q, cfg.rope_theta), _rope(k, cfg.rope_theta)
    group = cfg.n_heads // cfg.n_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("tnh,snh->nts", q, k) / np.sqrt(cfg.head_dim)
    o = np.einsum("nts,snh->tnh", _softmax(np.where(causal, s, -np.inf)), v)
    x = x + np.einsum("tnh,nhd->td", o, _p(a.o_proj))
    h = _rms(x, layer.mlp_norm.scale, cfg.rms_eps)
    m = layer.mlp
    if hasattr(m, "router"):
      probs = _softmax(h @ _p(m.router))
      ids = np.argsort(-probs, axis=-1, kind="stable")[:, :cfg.top_k]
      if forced_TLK is not None:
        ids = np.where(replay_T[:, None], forced_TLK[:, moe].astype(np.int64), ids)
      w = np.take_along_axis(probs, ids, -1)
      if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdims=True)
      y = np.zeros_like(x)
      for j in range(cfg.top_k):
        g, u, d = _p(m.gate)[ids[:, j]], _p(m.up)[ids[:, j]], _p(m.down)[ids[:, j]]  # per token's expert
        gate, up = np.einsum("td,tdf->tf", h, g), np.einsum("td,tdf->tf", h, u)
        y += w[:, j:j + 1] * np.einsum("tf,tfd->td", gate / (1 + np.exp(-gate)) * up, d)
      experts_used.append(ids)
      moe += 1
    else:
      gate, up = h @ _p(m.gate), h @ _p(m.up)
      y = (gate / (1 + np.exp(-gate)) * up) @ _p(m.down)
    x = x + y
  x = _rms(x, model.final_norm.scale, cfg.rms_eps)
  logits = x @ (_p(model.embedding).T if model.lm_head is None else _p(model.lm_head))
  z = logits - logits.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True)), experts_used
