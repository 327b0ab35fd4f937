r"""CPU quickstart: RL that visibly learns in minutes on 2 cores.

  python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart

A tiny random-init Llama (SmolLM2's architecture and 49K vocabulary at toy width) behind the `mini`
harness, served by the embedded JAX engine, on the four quickstart tasks (clawjax/data/quickstart):
each asks for one of four listed colour words (its own four) in a named file, scored by a real checker
on the workspace the harness's tool calls wrote. A cold-start SFT stage (scripted demonstrations through
the same harness) teaches the tool-call format and writes each listed word equally often, so RL starts
near reward 1/4 and must learn which word each task wants. Ends by printing {"steps", "reward_first5", "reward_last5"}.
"""

import pathlib

from ml_collections import config_dict

import clawjax

TASKS = pathlib.Path(clawjax.__file__).parent / "data" / "quickstart" / "tasks"


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.tasks = str(TASKS)
  c.harnesses = ("mini",)
  c.tasks_per_step = 4
  c.rollouts_per_task = 8          # GRPO groups of 8, as in the paper
  c.steps = 20
  c.seed = 0
  c.concurrency = 8                # the engine batches the concurrent rollouts' calls
  c.checkpoint_every = 5

  c.model = config_dict.ConfigDict()
  c.model.init = "smollm2-135m"    # its architecture and tokenizer ...
  c.model.random_init = True       # ... at toy size, randomly initialised:
  c.model.overrides = config_dict.ConfigDict(dict(
      d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=256))
  c.model.template = "smollm2"

  c.engine = config_dict.ConfigDict()
  c.engine.backend = "embedded"
  c.engine.options = config_dict.ConfigDict({"max_slots": 8, "max_seq_len": 1024})

  c.shim = config_dict.ConfigDict()
  c.shim.max_new_tokens = 48       # a write call is ~35 tokens
  c.shim.max_context = 1024        # mini's prompt is ~450 tokens
  c.shim.temperature = 1.0

  c.rollout = config_dict.ConfigDict()
  c.rollout.timeout_s = 120.0
  c.rollout.settle_interval_s = 0.05
  c.rollout.settle_checks = 2
  c.rollout.harness = config_dict.ConfigDict({"max_turns": 2})
  c.rollout.scoring = config_dict.ConfigDict({"timeout_s": 30.0})

  c.batch = config_dict.ConfigDict()
  # One ~520-token rollout tree a row (dense attention costs row_len^2: two trees in a 1024-token row
  # cost twice as much); a longer tree (many malformed retries) is left out and counted.
  c.batch.row_len = 640
  c.batch.rows = 32
  c.batch.max_staleness = 0

  c.learner = config_dict.ConfigDict()
  c.learner.lr = 1e-3              # a toy model from scratch (the paper's 1e-6 is for 30B)
  c.learner.temperature = 1.0
  c.learner.logits_chunk = 128

  c.sft = config_dict.ConfigDict()
  c.sft.demonstrator = "clawjax.data.quickstart.demonstrator:ChoiceDemonstrator"
  c.sft.steps = 100
  c.sft.lr = 3e-3
  c.sft.demos_per_task = 16
  c.sft.rows = 4
  c.sft.row_len = 640
  return c
