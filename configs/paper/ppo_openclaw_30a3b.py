r"""PPO inside OpenClaw (paper Eq. 2: branch-local GAE, gamma = lambda = 1), 256 tasks x 1 rollout.

  python experiments/train.py --config=configs/paper/ppo_openclaw_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=COLD_SFT_DIR --config.engine.url=http://SGLANG:30000 \
      --config.engine.export_dir=SHARED_DIR --workdir=runs/ppo_openclaw_30a3b

The critic is a separate trunk initialised from the policy; it is pretrained (critic-only updates on
the first step's rollouts) before RL, as the paper does; how long is not published (common.py).

Compiled for its slice, compile.topology v5p:4x4x4 (experiments/compile.py at f42c31a, 2026-12-04, on a
2-core CPU host, compile-only devices): it does not fit yet, 1329.5 GiB per device (14.2 of them
parameters and the optimizers' state) against 95 GiB of HBM: per-layer activations, see BENCHMARKS.md.
5.29e18 FLOPs a step, 180.1 s at the chips' peak.
"""

from clawjax.config import config_module

paper_config = config_module(__file__, "common.py").paper_config


def get_config():
  return paper_config("openclaw", loss="ppo")
