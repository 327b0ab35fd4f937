r"""PPO inside OpenClaw (paper Eq. 2: branch-local GAE, gamma = lambda = 1), 256 tasks x 1 rollout.

  python experiments/train.py --config=configs/paper/ppo_openclaw_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=COLD_SFT_DIR --config.engine.url=http://SGLANG:30000 \
      --config.engine.export_dir=SHARED_DIR --workdir=runs/ppo_openclaw_30a3b

The critic is a separate trunk initialised from the policy; it is pretrained (critic-only updates on
the first step's rollouts) before RL, as the paper does; how long is not published (common.py).

Compiled for its slice, compile.topology v5p:4x4x4 (experiments/compile.py at eb01874, 2026-12-04, on a
2-core CPU host, compile-only devices): it fits, 78.0 of 95 GiB per device (14.2 of them parameters and
the optimizers' state). The critic's gradient is taken after the policy's (learner.value.two_pass): with
one joint backward both trunks' saved activations are live together and the step needs 100.3 GiB. The
mesh is fsdp 32 x tensor 2 with 8 micro-batches (a row per fsdp shard): fsdp 64 fits too, at 91.6 GiB,
too close to the chip's 95 for a real run. 5.82e18 FLOPs a step (the critic's second forward included),
198 s at the chips' peak. Figures in BENCHMARKS.md.
"""

from clawjax.config import config_module

paper_config = config_module(__file__, "common.py").paper_config


def get_config():
  c = paper_config("openclaw", loss="ppo")
  c.mesh.tensor = 2  # fsdp takes the rest: 32 on v5p:4x4x4
  c.learner.micro_batches = 8  # 32 rows of 64K tokens a micro-batch: one a row shard of v5p:4x4x4
  return c
