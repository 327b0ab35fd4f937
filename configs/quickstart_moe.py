r"""CPU quickstart on a mixture of experts, with rollout routing replay.

  python experiments/train.py --config=configs/quickstart_moe.py --workdir=runs/quickstart_moe

The quickstart (configs/quickstart.py: its tasks, harness, SmolLM2 vocabulary and template, cold start)
on a toy Qwen3-MoE: 8 experts of width 64, 2 per token, in both layers. The embedded engine records the
experts its MoE layers choose for every token (`engine.options.record_routes`), the shim logs them once per
rollout-tree token, and the learner replays them (`learner.routing_replay="rollout"`: a step without routes
is an error): each step's metrics report `routing/replayed_frac` (the share of the positions the loss
depends on that were replayed, 1.0 here) and `routing/disagree_frac` (how often the learner's own top-k
differs from the engine's).
"""

from ml_collections import config_dict

from clawjax.config import config_module

quickstart = config_module(__file__, "quickstart.py")


def get_config() -> config_dict.ConfigDict:
  c = quickstart.get_config()
  c.model.overrides = config_dict.ConfigDict(dict(
      c.model.overrides.to_dict(), family="qwen3_moe", qk_norm=True, n_experts=8, top_k=2, moe_mlp_dim=64))
  c.engine.options.record_routes = True
  c.learner.routing_replay = "rollout"
  return c
