r"""A small real evaluation on CPU: SmolLM2-135M (embedded JAX engine) through the `mini` harness on
the bundled toy tasks (clawjax/data/tasks). A few minutes on 2 cores.

  python experiments/eval.py --config=configs/eval/toy_cpu.py --workdir=runs/eval/toy-smollm2

`--config.model.init=test-tiny --config.model.template=qwen3` swaps in a random tiny Qwen3 (faster,
scores ~0); `--config.max_tasks=2` runs a slice.
"""

from ml_collections import config_dict

from clawjax.tasks import bundled_tasks_dir


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.tasks = str(bundled_tasks_dir())
  c.benchmark = "toy"
  c.harness = "mini"
  c.model_label = config_dict.placeholder(str)  # the engine model's name
  c.task_ids = ()
  c.max_tasks = 0
  c.num_samples = 1
  c.concurrency = 2  # the engine batches concurrent rollouts' calls
  c.rerun_statuses = ("failed",)
  c.unscored = "zero"
  c.progress = True
  c.shim_url = config_dict.placeholder(str)

  c.model = config_dict.ConfigDict()
  c.model.init = "smollm2-135m"

  c.engine = config_dict.ConfigDict()
  c.engine.backend = "embedded"
  c.engine.options = config_dict.ConfigDict({"max_slots": 2, "max_seq_len": 4096})

  c.shim = config_dict.ConfigDict()
  c.shim.max_context = 4096  # SmolLM2's mini prompts are ~1K tokens
  c.shim.max_new_tokens = 128  # keeps a turn of a small model short on CPU
  c.shim.temperature = 0.7

  c.rollout = config_dict.ConfigDict()
  c.rollout.timeout_s = 300.0
  c.rollout.settle_interval_s = 0.2
  c.rollout.keep_dirs = False
  c.rollout.harness = config_dict.ConfigDict()
  c.rollout.harness.max_turns = 4
  c.rollout.scoring = config_dict.ConfigDict()
  c.rollout.scoring.timeout_s = 60.0
  return c
