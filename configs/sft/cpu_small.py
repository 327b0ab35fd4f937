r"""CPU cold start on the bundled data, in about two minutes on 2 cores.

  python experiments/sft.py --config=configs/sft/cpu_small.py --workdir=runs/sft-cpu
  python experiments/eval.py --config=configs/eval/toy_cpu.py --config.model.init=runs/sft-cpu/hf \
      --config.tasks=clawjax/data/sft/tasks --config.shim.temperature=0 --workdir=runs/eval/sft-cpu

The quickstart's toy model (SmolLM2's architecture and 49K vocabulary at d_model 64, 2 layers, random
init) learns the bundled family from 30 trajectories (clawjax/data/sft: 'Into the file "FILE", write
the word "WORD".' through the `mini` harness; scripts/make_sft_data.py writes them), its loss on the 6
held-out trajectories (file and word pairs it never saw together) measured every 40 updates. The export
(WORKDIR/hf) is a model directory: the second command serves it with the embedded engine and runs it
greedily through `mini` on the 6 held-out tasks, scored by their checkers (tests/sft/test_learning.py:
all 6 solved).
"""

import pathlib

from ml_collections import config_dict

import clawjax

DATA = pathlib.Path(clawjax.__file__).parent / "data" / "sft"


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.data = config_dict.ConfigDict({"openai": (str(DATA / "train.jsonl"),)})
  c.heldout = config_dict.ConfigDict({"openai": (str(DATA / "heldout.jsonl"),)})
  c.max_len = 1024                 # a trajectory is ~510 tokens: two a row
  c.rows = 4                       # 4 updates an epoch
  c.epochs = 50                    # 200 updates: copying the file and word needs many passes
  c.eval_every = 40
  c.checkpoint_every = 50
  c.model = config_dict.ConfigDict()
  c.model.init = "smollm2-135m"    # its architecture and tokenizer ...
  c.model.random_init = True       # ... at toy size, randomly initialised (as configs/quickstart.py)
  c.model.overrides = config_dict.ConfigDict(dict(
      d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=256,
      attention_impl="blocked", attention_block=256))  # skips the key blocks of other conversations
  c.model.template = "smollm2"
  c.learner = config_dict.ConfigDict()
  c.learner.lr = 3e-3              # a toy model from scratch needs a large step (quickstart's SFT value)
  c.learner.logits_chunk = 32      # ~40 trained tokens a conversation: few padded loss slots
  return c
