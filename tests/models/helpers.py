"""Helpers for the model tests: tiny random HF checkpoints, hand-built token trees, the parity metric."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@nnx.jit
def forward(model, tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT):
  """A compiled model call: tests run small models, where eager op-by-op dispatch dominates."""
  return model(tokens_BT, positions_BT, segment_ids_BT, subtree_end_BT)


def perturb_norms(hf_model, seed: int = 0) -> None:
  """HF initialises RMSNorm weights to 1, which would hide a norm applied to the wrong tensor."""
  import torch
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in hf_model.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))


def save_tiny_hf(out, kind: str, **overrides):
  """(directory, torch model) of a tiny random HF `kind` model saved under `out`."""
  import torch
  import transformers
  torch.manual_seed(0)
  common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256)
  if kind == "llama":
    cfg = transformers.LlamaConfig(**{**common, "rope_theta": 100_000.0, "tie_word_embeddings": True, **overrides})
    model = transformers.LlamaForCausalLM(cfg)
  elif kind == "qwen3":
    cfg = transformers.Qwen3Config(**{**common, "rope_theta": 1_000_000.0, **overrides})
    model = transformers.Qwen3ForCausalLM(cfg)
  else:
    cfg = transformers.Qwen3MoeConfig(**{**common, "num_experts": 8, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 32, "norm_topk_prob": True, **overrides})
    model = transformers.Qwen3MoeForCausalLM(cfg)
  perturb_norms(model)
  model.eval()
  model.save_pretrained(out)
  return out, model


@dataclasses.dataclass
class Tree:
  """A token tree flattened depth-first, with each root-to-leaf path as a list of flat indices."""
  tokens: np.ndarray
  depth: np.ndarray
  subtree_end: np.ndarray  # relative to the tree's first token
  paths: list[list[int]]


def save_fused(hf_dir, hf_model, out):
  """A dump of `hf_model` as transformers 5 holds it in memory: experts fused (gate_up_proj [E, 2F, D])."""
  from safetensors.torch import save_file
  out.mkdir()
  state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
  assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
  save_file(state, out / "model.safetensors")
  (out / "config.json").write_text((hf_dir / "config.json").read_text())
  return out


def random_tree(rng: np.random.Generator, vocab: int, n_nodes: int = 5, max_span: int = 6) -> Tree:
  """A random tree whose nodes are token spans; node k > 0 hangs under a random earlier node."""
  parents = [-1] + [int(rng.integers(0, k)) for k in range(1, n_nodes)]
  spans = [list(rng.integers(1, vocab, size=int(rng.integers(1, max_span + 1)))) for _ in range(n_nodes)]
  children = {k: [c for c in range(n_nodes) if parents[c] == k] for k in range(n_nodes)}
  tokens, depth, ends, paths = [], [], [], []

  def visit(node: int, start_depth: int, prefix: list[int]) -> None:
    mine = []
    for offset, tok in enumerate(spans[node]):
      mine.append(len(tokens))
      tokens.append(tok)
      depth.append(start_depth + offset)
      ends.append(None)
    for child in children[node]:
      visit(child, start_depth + len(spans[node]), prefix + mine)
    if not children[node]:
      paths.append(prefix + mine)
    for i in mine:
      ends[i] = len(tokens)

  visit(0, 0, [])
  return Tree(np.array(tokens, np.int32), np.array(depth, np.int32), np.array(ends, np.int32), paths)


def pack_row(trees: list[Tree], length: int) -> dict[str, np.ndarray]:
  """One row holding `trees` as segments 1.. followed by padding (the batch.py layout)."""
  tokens, positions, segments, ends = (np.zeros(length, np.int32) for _ in range(4))
  ends[:] = np.arange(length) + 1
  offset = 0
  for seg, tree in enumerate(trees, start=1):
    n = len(tree.tokens)
    sl = slice(offset, offset + n)
    tokens[sl], positions[sl], segments[sl], ends[sl] = tree.tokens, tree.depth, seg, tree.subtree_end + offset
    offset += n
  assert offset <= length
  return dict(tokens=tokens, positions=positions, segment_ids=segments, subtree_end=ends)


def rel_err(ours, ref) -> float:
  """max |ours - ref| / max |ref|: the parity metric (elementwise rtol would blow up near zero)."""
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


_RAGGED_DOT = jax.lax.ragged_dot


def _nan_outside_groups(y_MN: jax.Array, group_sizes_G: jax.Array) -> jax.Array:
  return jnp.where((jnp.arange(y_MN.shape[0]) < jnp.sum(group_sizes_G))[:, None], y_MN, jnp.nan)


@jax.custom_vjp
def garbage_ragged_dot(lhs_MK, rhs_GKN, group_sizes_G):
  """`lax.ragged_dot` with NaN in the rows outside its groups, in its output and its input gradient: what its
  contract allows a kernel to leave there (tests substitute it for `jax.lax.ragged_dot`)."""
  return _nan_outside_groups(_RAGGED_DOT(lhs_MK, rhs_GKN, group_sizes_G), group_sizes_G)


def _garbage_fwd(lhs_MK, rhs_GKN, group_sizes_G):
  return garbage_ragged_dot(lhs_MK, rhs_GKN, group_sizes_G), (lhs_MK, rhs_GKN, group_sizes_G)


def _garbage_bwd(residuals, dy_MN):
  lhs_MK, rhs_GKN, group_sizes_G = residuals
  _, vjp = jax.vjp(lambda x, w: _RAGGED_DOT(x, w, group_sizes_G), lhs_MK, rhs_GKN)
  dx_MK, dw_GKN = vjp(dy_MN)
  return _nan_outside_groups(dx_MK, group_sizes_G), dw_GKN, None


garbage_ragged_dot.defvjp(_garbage_fwd, _garbage_bwd)
