r"""The harness transfer matrix at CPU size: the quickstart's toy policy (trained in `mini`,
configs/quickstart.py) and its random initialisation, each evaluated under `mini` and real Codex CLI on
the quickstart's four tasks. Minutes on 2 cores after the quickstart's own ten:

  python experiments/train.py --config=configs/quickstart.py --workdir=runs/quickstart
  python -m clawjax.models export --checkpoint runs/quickstart/checkpoints/20 --out runs/quickstart/hf
  for h in mini codex; do
    python experiments/eval.py --config=configs/eval/transfer_cpu.py --config.harness=$h \
        --config.model.init=runs/quickstart/hf --workdir=runs/eval/transfer-mini-$h
    python experiments/eval.py --config=configs/eval/transfer_cpu.py:base --config.harness=$h \
        --workdir=runs/eval/transfer-base-$h
  done
  python experiments/tables.py --transfer --runs runs/eval/transfer-*

`:base` is the random initialisation the quickstart starts from (trained_in "base"); the default is a
policy trained in mini (`model.init`: its exported directory). Codex's prompt is ~9K tokens in this
vocabulary where mini's is ~450, hence the 16K window. The quickstart tasks are the training tasks: a
toy, not a held-out benchmark.
"""

import pathlib

from ml_collections import config_dict

import clawjax

TASKS = pathlib.Path(clawjax.__file__).parent / "data" / "quickstart" / "tasks"
# The quickstart's toy architecture (configs/quickstart.py), for the random initialisation.
TOY = {"d_model": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "head_dim": 32, "mlp_dim": 256}
_VARIANTS = ("trained", "base")


def get_config(variant: str = "trained") -> config_dict.ConfigDict:
  if variant not in _VARIANTS:
    raise ValueError(f"configs/eval/transfer_cpu.py:{variant}: expected one of {_VARIANTS}")
  c = config_dict.ConfigDict()
  c.tasks = str(TASKS)
  c.benchmark = "quickstart"
  c.harness = "mini"
  c.trained_in = "mini" if variant == "trained" else "base"
  c.model_label = "toy-" + c.trained_in
  c.num_samples = 2  # rollouts per task: a task scores their mean
  c.concurrency = 4  # the engine batches concurrent rollouts' calls
  c.progress = True

  c.model = config_dict.ConfigDict()
  if variant == "base":
    c.model.init = "smollm2-135m"  # its architecture and tokenizer, at toy size, randomly initialised
    c.model.random_init = True
    c.model.overrides = config_dict.ConfigDict(TOY)
  else:
    c.model.init = config_dict.placeholder(str)  # the exported policy (an HF directory)
  c.model.template = "smollm2"

  c.engine = config_dict.ConfigDict()
  c.engine.backend = "embedded"
  c.engine.options = config_dict.ConfigDict({"max_slots": 4, "max_seq_len": 16384})

  c.shim = config_dict.ConfigDict()
  c.shim.max_context = 16384
  c.shim.max_new_tokens = 48  # the quickstart's: a write call is ~35 tokens
  c.shim.temperature = 1.0

  c.rollout = config_dict.ConfigDict()
  c.rollout.timeout_s = 300.0
  c.rollout.settle_interval_s = 0.1
  c.rollout.harness = config_dict.ConfigDict()
  c.rollout.harness.max_turns = 2  # mini's (Codex has no turn limit: the rollout's timeout bounds it)
  # Codex compacts from 12K: its replies are 48 tokens and its tool outputs ~2.5K.
  c.rollout.harness.codex_compact_reserve = 4096
  c.rollout.scoring = config_dict.ConfigDict()
  c.rollout.scoring.timeout_s = 30.0
  return c
