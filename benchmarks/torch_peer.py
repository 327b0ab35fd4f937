"""The PyTorch + transformers peer of the learner step: what a user would otherwise run on the same GPU.

A Qwen3ForCausalLM at a clawjax preset's shapes (random init, `--layers` of them): float32 parameters under
bf16 autocast, gradient checkpointing, SDPA attention over one causal row of `--row-len` tokens, fused
AdamW. A step is the RL learner's work as verl and slime run it: the pi_old forward without a gradient,
then forward and backward of the clipped-ratio loss, and the optimizer update. Its model FLOPs are counted
as clawjax's device check counts its own (3 x the forward: layers, attention pairs of a causal row, the
vocabulary projection at every token; recomputation not counted: `clawjax.aot.flops.forward_flops`), so
the two MFUs compare directly.

  python benchmarks/torch_peer.py --row-len 8192 [--preset qwen3-8b --layers 4] [--json]

The preset's shapes come from clawjax's model table, which imports JAX: JAX is kept on the CPU here, so
its memory pool never takes the GPU's memory from PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch  # pylint: disable=wrong-import-position
from transformers import Qwen3Config, Qwen3ForCausalLM  # pylint: disable=wrong-import-position

from clawjax.aot import flops, topology  # pylint: disable=wrong-import-position
from clawjax.models.config import ModelConfig, preset  # pylint: disable=wrong-import-position

def hf_config(cfg: ModelConfig) -> Qwen3Config:
  if cfg.n_experts:
    raise ValueError(f"torch_peer: a dense Qwen3 preset, not an MoE ({cfg.n_experts} experts)")
  return Qwen3Config(hidden_size=cfg.d_model, intermediate_size=cfg.mlp_dim, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                     vocab_size=cfg.vocab_size, rms_norm_eps=cfg.rms_eps, rope_theta=cfg.rope_theta,
                     tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=131072,
                     attn_implementation="sdpa", use_cache=False)


def _token_logprobs(model: Qwen3ForCausalLM, ids_BT: torch.Tensor) -> torch.Tensor:
  logits_BTV = model(input_ids=ids_BT, use_cache=False).logits[:, :-1].float()
  return torch.log_softmax(logits_BTV, -1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)


def step_bytes(cfg: ModelConfig, row_len: int) -> float:
  """The peer step's peak memory, estimated on the high side: float32 parameters, their gradients and
  AdamW's two moments (16 bytes a parameter); the vocabulary projection, the step's largest activations
  (per row position and vocabulary entry: bf16 logits 2 bytes, their float32 copy 4, the log-softmax
  kept for the backward 4, and in the backward its gradient 4: 14 bytes; 32,767 x 151,936 float32
  log-probs alone are 19.9 GB); the layers' checkpointed inputs (float32) and one layer's recomputed
  activations (bf16: q, k, v, the attention output, the MLP's three hidden projections)."""
  params = flops.total_params(cfg)
  layer = cfg.n_heads * cfg.head_dim * 2 + 2 * cfg.n_kv_heads * cfg.head_dim + 3 * cfg.mlp_dim
  return 16.0 * params + row_len * (14.0 * cfg.vocab_size + 4.0 * cfg.n_layers * cfg.d_model + 2.0 * layer)


def device_memory_bytes() -> int:
  """What the peer's device holds: the GPU's memory, or the machine's on a CPU."""
  if torch.cuda.is_available():
    return torch.cuda.get_device_properties(0).total_memory
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fitting_row_len(cfg: ModelConfig, row_len: int, memory_bytes: float, *, share: float = 0.9,
                    multiple: int = 1024) -> int:
  """`row_len`, or the longest multiple of `multiple` below it whose `step_bytes` fit `share` of
  `memory_bytes` (0 when none does)."""
  budget = share * memory_bytes
  if step_bytes(cfg, row_len) <= budget:
    return row_len
  fits = [n for n in range(multiple, row_len, multiple) if step_bytes(cfg, n) <= budget]
  return fits[-1] if fits else 0


def peer_step(cfg: ModelConfig, row_len: int, *, warmup: int = 1, repeats: int = 2, seed: int = 0) -> dict[str, Any]:
  """The peer's step on one row: median seconds over `repeats` after `warmup` steps, tokens/s, FLOPs, MFU
  (None off a GPU of known peak) and the allocator's peak GiB."""
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(seed)
  model = Qwen3ForCausalLM(hf_config(cfg)).to(device)
  # The newer name where transformers has it (the older one warns there); a GPU image's release may predate it.
  getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
  gen = torch.Generator(device=device).manual_seed(seed)
  ids_BT = torch.randint(16, cfg.vocab_size, (1, row_len), device=device, generator=gen)
  advantages_BT = torch.randn(1, row_len - 1, device=device, generator=gen)

  def sync() -> None:
    if device == "cuda":
      torch.cuda.synchronize()

  def step() -> float:
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
      logp_old_BT = _token_logprobs(model, ids_BT)
    with torch.autocast(device, dtype=torch.bfloat16):
      ratio_BT = torch.exp(_token_logprobs(model, ids_BT) - logp_old_BT)
      loss = -torch.minimum(ratio_BT * advantages_BT, ratio_BT.clamp(0.8, 1.28) * advantages_BT).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    return time.perf_counter() - start

  first_s = sum(step() for _ in range(warmup))
  step_s = statistics.median(step() for _ in range(repeats))
  name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
  model_flops = 3 * sum(flops.forward_flops(cfg, tokens=row_len, attended_pairs=row_len * (row_len + 1) / 2,
                                            logit_tokens=row_len))
  chip = topology.chip_of(name)
  return {"device": name, "torch": torch.__version__, "row_len": row_len, "layers": cfg.n_layers,
          "tokens": row_len, "warmup_s": round(first_s, 3), "step_s": step_s, "tokens_per_s": row_len / step_s,
          "flops": model_flops, "mfu": model_flops / step_s / chip.peak_flops if chip else None,
          "peak_mem_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--preset", default="qwen3-8b", help="a dense Qwen3 preset of clawjax.models.config")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--row-len", type=int, default=8192)
  p.add_argument("--repeats", type=int, default=2)
  p.add_argument("--json", action="store_true", help="print one JSON object")
  args = p.parse_args(argv)
  out = peer_step(preset(args.preset, n_layers=args.layers), args.row_len, repeats=args.repeats)
  print(json.dumps(out) if args.json else "\n".join(f"{k:14s} {v}" for k, v in out.items()))
  return out


if __name__ == "__main__":
  main()
