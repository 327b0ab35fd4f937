"""The paper's training setup (ClawGym II, section 8) as a ConfigDict that the configs beside this file
adjust; every value the paper leaves open is set and documented here, and only here.

Published: Qwen3-30B-A3B, 64K context, GRPO 32 tasks x 8 rollouts per update (PPO 256 x 1, with a
pretrained value model), 256 rollouts per update, 200-400 stable steps. Every other value is not
published; the defaults below say where they come from (ClawGym part I's recipe where it has one).
Fields not set here keep the defaults documented in their dataclasses (clawjax/train/config.py).
"""

from __future__ import annotations

from ml_collections import config_dict


def paper_config(*harnesses: str, loss: str = "grpo") -> config_dict.ConfigDict:
  """GRPO: 32 tasks x 8 rollouts per update (mix-harness: the tasks split over the harnesses, one group
  per (task, harness), 256 rollouts in all); PPO: 256 tasks x 1 rollout and a pretrained critic."""
  c = config_dict.ConfigDict()
  c.tasks = config_dict.placeholder(str)  # ClawGym-SynData (directory or JSONL layout): --config.tasks
  c.harnesses = harnesses
  c.tasks_per_step = 256 if loss == "ppo" else 32 // len(harnesses)
  c.rollouts_per_task = 1 if loss == "ppo" else 8
  c.steps = 300                  # the paper reports stability over 200-400 steps
  c.seed = 0
  c.concurrency = 64             # rollouts in flight (sandbox and engine capacity, not published)
  c.checkpoint_every = 10
  c.keep_checkpoints = 3
  c.eval_tasks = config_dict.placeholder(str)  # held-out tasks (e.g. a ClawGym-Bench slice)
  c.eval_every = 0
  c.eval_samples = 1

  c.model = config_dict.ConfigDict()
  c.model.init = config_dict.placeholder(str)  # HF dir: Qwen3-30B-A3B (Claude Code) or ClawII-Cold (OpenClaw)
  c.model.overrides = config_dict.ConfigDict({"dtype": "bfloat16", "param_dtype": "float32",
                                              "attention_impl": "pallas", "remat": True})
  c.model.template_family = "qwen3"

  c.engine = config_dict.ConfigDict()
  c.engine.backend = "sglang"
  c.engine.url = config_dict.placeholder(str)         # the SGLang server serving model.init
  c.engine.export_dir = config_dict.placeholder(str)  # a path the SGLang server can read
  # Each call's routed experts for rollout routing replay (learner.routing_replay "auto"): Qwen3-30B-A3B
  # routes a token to 8 experts. The SGLang servers run with --enable-return-routed-experts.
  c.engine.options = config_dict.ConfigDict({"routed_experts": 8})

  # expert 1: at 64K tokens a device, fsdp's per-layer gather of the experts should hide behind their
  # compute; expert parallelism is for fewer tokens a device (clawjax/sharding.py's MeshConfig says when).
  c.mesh = config_dict.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "expert": 1})
  # The slice these settings are sized for (experiments/compile.py; figures in BENCHMARKS.md), and the
  # architecture compiled there while model.init is the launch-time placeholder.
  c.compile = config_dict.ConfigDict({"topology": "v5p:4x4x4", "model": "qwen3-30b-a3b"})

  c.shim = config_dict.ConfigDict()
  c.shim.max_context = 65_536    # paper: 64K
  c.shim.max_new_tokens = 8_192  # ClawGym part I
  c.shim.temperature = 1.0       # not published; 1.0 keeps pi_rollout the model's own distribution

  c.rollout = config_dict.ConfigDict()
  c.rollout.timeout_s = 1800.0   # not published
  c.rollout.settle_checks = 3    # not published
  c.rollout.settle_interval_s = 0.5
  c.rollout.settle_timeout_s = 60.0
  c.rollout.harness = config_dict.ConfigDict({"max_turns": 30})
  # Harnesses run in bubblewrap or not at all: without it an agent could read the hidden checkers.
  c.rollout.sandbox = config_dict.ConfigDict({"mode": "bwrap"})

  c.filters = config_dict.ConfigDict({"max_leaves": 64})  # over-branching threshold: not published

  c.batch = config_dict.ConfigDict()
  c.batch.row_len = 65_536       # one whole 64K-context rollout tree fits a row
  c.batch.rows = 256             # all 256 rollouts of a step in one update
  c.batch.max_staleness = 1

  c.learner = config_dict.ConfigDict()
  c.learner.loss = loss
  c.learner.lr = 1e-6            # ClawGym part I
  c.learner.eps_low = 0.2        # ClawGym part I
  c.learner.eps_high = 0.28      # ClawGym part I
  c.learner.kl_coef = 0.0        # ClawGym part I
  c.learner.c_bar = 2.0          # not published; peer systems use 2
  c.learner.temperature = 1.0    # must equal shim.temperature
  c.learner.micro_batches = 4    # 64 rows of 64K tokens a micro-batch: one row per device of v5p:4x4x4
  # One update per collected batch, as the paper reports it ("256 rollouts per update"); raise for
  # PPO-style reuse (pi_old frozen over several passes; the PPO paper used 3-10 epochs).
  c.learner.epochs = 1
  c.learner.minibatches = 1      # must divide micro_batches
  c.learner.logits_chunk = 512
  if loss == "ppo":
    # A separate critic trunk initialised from the policy, pretrained on the first step's rollouts before
    # RL as the paper does; none of its values are published (coef and clip: common PPO values). Its
    # gradient is taken after the policy's (two_pass): both 30B trunks' saved activations would not fit.
    c.learner.value = config_dict.ConfigDict({"kind": "separate", "coef": 0.5, "clip": 0.2, "pretrain_lr": 1e-5,
                                              "two_pass": True})
    c.value_pretrain_steps = 50
  return c
