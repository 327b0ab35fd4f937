r"""ClawII-Cold: the cold-start SFT of Qwen3-30B-A3B on ClawGym's synthesized OpenClaw trajectories, the
starting point of the paper's OpenClaw runs (configs/paper/grpo_openclaw_30a3b.py takes its export as
`--config.model.init`).

  python experiments/sft.py --config=configs/sft/cold_start_30a3b.py \
      --config.data.openai=PATH/clawgym_sft.jsonl --config.tools_file=PATH/openclaw_tools.json \
      --config.model.init=PATH/Qwen3-30B-A3B --workdir=runs/cold_30a3b
  python experiments/train.py --config=configs/paper/grpo_openclaw_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=runs/cold_30a3b/hf --config.engine.url=http://SGLANG:30000 ...

Published (ClawGym part I, ClawGym-Agents' SFT launch script for OpenRLHF `train_sft`): max length 65536,
3 epochs, learning rate 1e-5, 128 conversations per update, packed samples, bf16, a checkpoint every 80
updates, 10 kept, the loss on the assistant turns of multi-turn OpenAI-format conversations with tool
calls. The paper trains its MoE with an internal Megatron setup whose values are not published; these
are the published ones. Left at OpenRLHF's defaults by the script, and so here (clawjax/sft/config.py):
AdamW betas (0.9, 0.95), no weight decay, gradient clipping at 1.0, warm-up over 3% of the updates, then
cosine to 10% of the peak. ClawGym's data leaves out the tool list: its tokenising script adds OpenClaw's
tools to every conversation, which `tools_file` does here (a JSON list of the tools in the OpenAI format).

Not published, chosen here: an update is `rows` packed rows of 64K tokens. OpenRLHF's 128 is a count of
conversations; with ClawGym's trajectories (a 64K context, most of them long) a row holds one or two, so
128 rows is 128-256 conversations an update: set rows to about 128 x your mean length / 65536 to match
it. The mesh, precision and memory settings follow configs/paper/common.py (bfloat16 activations on
float32 master weights, as OpenRLHF's --bf16 with ZeRO keeps them; parameters and optimizer state
sharded over every device; layers recomputed in the backward pass; a micro-batch one row per device).

Compiled for its slice, compile.topology v5p:4x4x4 (experiments/compile.py at e774e8a, 2026-12-04, on a
2-core CPU host, compile-only devices): it fits, 70.9 GiB per device (5.3 of them parameters and Adam
state) of 95 GiB of HBM. 1.34e18 FLOPs a step, 45.5 s at the chips' peak (BENCHMARKS.md).
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.data = config_dict.ConfigDict({"openai": ()})  # --config.data.openai=PATH.jsonl (a comma list)
  c.tools_file = config_dict.placeholder(str)
  c.heldout_fraction = 0.01      # not published; 1% of the trajectories for the held-out loss
  c.max_len = 65_536             # ClawGym (--max_len)
  c.overlong = "cut"
  c.rows = 128                   # see the docstring (ClawGym: --train_batch_size 128 conversations)
  c.epochs = 3                   # ClawGym (--max_epochs)
  c.warmup_ratio = 0.03          # OpenRLHF's default
  c.min_lr_ratio = 0.1           # OpenRLHF's default (cosine_with_min_lr)
  c.eval_every = 80              # not published (ClawGym: --eval_steps -1, no held-out loss)
  c.checkpoint_every = 80        # ClawGym (--save_steps)
  c.keep_checkpoints = 10        # ClawGym (--max_ckpt_num)
  c.bad_lines = "stop"

  c.model = config_dict.ConfigDict()
  c.model.init = config_dict.placeholder(str)  # the Qwen3-30B-A3B HF directory
  c.model.overrides = config_dict.ConfigDict({"dtype": "bfloat16", "param_dtype": "float32",
                                              "attention_impl": "pallas", "remat": True})
  c.model.template_family = "qwen3"

  c.mesh = config_dict.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "expert": 1})
  # The slice these settings are sized for (experiments/compile.py; figures in BENCHMARKS.md), and the
  # architecture compiled there while model.init is the launch-time placeholder.
  c.compile = config_dict.ConfigDict({"topology": "v5p:4x4x4", "model": "qwen3-30b-a3b"})

  c.learner = config_dict.ConfigDict()
  c.learner.loss = "sft"
  c.learner.lr = 1e-5            # ClawGym (--learning_rate)
  c.learner.adam_b1 = 0.9        # OpenRLHF's default
  c.learner.adam_b2 = 0.95       # OpenRLHF's default
  c.learner.weight_decay = 0.0   # OpenRLHF's default (--l2 0)
  c.learner.grad_clip = 1.0      # OpenRLHF's default (--max_norm)
  c.learner.micro_batches = 2    # 64 rows of 64K tokens a micro-batch: one row per device of v5p:4x4x4
  c.learner.logits_chunk = 512
  return c
