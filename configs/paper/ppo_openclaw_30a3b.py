r"""PPO inside OpenClaw (paper Eq. 2: branch-local GAE, gamma = lambda = 1), 256 tasks x 1 rollout.

  python experiments/train.py --config=configs/paper/ppo_openclaw_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=COLD_SFT_DIR --config.engine.url=http://SGLANG:30000 \
      --config.engine.export_dir=SHARED_DIR --workdir=runs/ppo_openclaw_30a3b

The critic is a separate trunk initialised from the policy; it is pretrained (critic-only updates on
the first step's rollouts) before RL, as the paper does; how long is not published.
"""

from clawjax.rl.loop_paper import paper_config


def get_config():
  c = paper_config("openclaw")
  c.tasks_per_step = 256
  c.rollouts_per_task = 1
  c.learner.loss = "ppo"
  c.learner.value = {"kind": "separate", "coef": 0.5, "clip": 0.2, "pretrain_lr": 1e-5}
  c.value_pretrain_steps = 50  # not published
  return c
