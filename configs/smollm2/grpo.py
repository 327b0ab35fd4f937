r"""GRPO of a real pretrained model on CPU: SmolLM2-135M-Instruct after its cold start, through `mini`.

  python experiments/train.py --config=configs/smollm2/grpo.py --config.model.init=runs/smollm2/cold_start/hf \
      --config.tasks=runs/smollm2/data/train_tasks --workdir=runs/smollm2/grpo
  python -m clawjax.models export --checkpoint runs/smollm2/grpo/checkpoints/8 --out runs/smollm2/grpo/hf

The tasks are the cold start's training pairs (configs/smollm2/cold_start.py writes them), 4 a step in
GRPO groups of 4, each scored by its real checker: 1 when the named file holds the named word. The cold
start has shown the tool-call format once per trajectory; RL rewards the rollouts that use it correctly.
The evaluation runs on the 20 held-out tasks (configs/eval/toy_cpu.py with --config.tasks). About
20 minutes on 2 cores.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.tasks = config_dict.placeholder(str)
  c.harnesses = ("mini",)
  c.tasks_per_step = 4
  c.rollouts_per_task = 4          # GRPO groups of 4 (the paper: 8) keep a step's learner update short on CPU
  c.steps = 8
  c.seed = 0
  c.concurrency = 8                # the engine batches the concurrent rollouts' calls
  c.checkpoint_every = 4

  c.model = config_dict.ConfigDict()
  c.model.init = config_dict.placeholder(str)  # the cold start's export
  c.model.template = "smollm2"
  c.model.overrides = config_dict.ConfigDict(dict(attention_impl="blocked", attention_block=256))

  c.engine = config_dict.ConfigDict()
  c.engine.backend = "embedded"
  c.engine.options = config_dict.ConfigDict({"max_slots": 8, "max_seq_len": 1024})

  c.shim = config_dict.ConfigDict()
  c.shim.max_new_tokens = 64       # a write call is ~35 tokens
  c.shim.max_context = 1024        # mini's prompt is ~450 tokens
  c.shim.temperature = 1.0

  c.rollout = config_dict.ConfigDict()
  c.rollout.timeout_s = 300.0
  c.rollout.harness = config_dict.ConfigDict({"max_turns": 2})  # the tool call, then the final answer
  c.rollout.scoring = config_dict.ConfigDict({"timeout_s": 30.0})

  c.batch = config_dict.ConfigDict()
  c.batch.row_len = 640            # one ~520-token rollout tree a row
  c.batch.rows = 16
  c.batch.max_staleness = 0

  c.learner = config_dict.ConfigDict()
  c.learner.lr = 2e-5              # small steps on pretrained weights (the paper's 1e-6 is for 30B)
  c.learner.temperature = 1.0
  c.learner.logits_chunk = 128
  c.learner.micro_batches = 4      # 4 rows at a time: the whole step's activations at once need > 20 GiB

  c.sft = config_dict.ConfigDict({"steps": 0})  # the cold start is configs/smollm2/cold_start.py
  return c
