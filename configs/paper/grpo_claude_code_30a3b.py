r"""GRPO inside Claude Code (Table 1 row ClawII-CC-30A3B), from the Qwen3-30B-A3B base.

32 tasks x 8 rollouts per update, 64K context, SGLang engine (GPU/TPU cluster):

  python experiments/train.py --config=configs/paper/grpo_claude_code_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=MODEL_DIR --config.engine.url=http://SGLANG:30000 \
      --config.engine.export_dir=SHARED_DIR --workdir=runs/grpo_claude_code_30a3b

Unpublished values are set and documented in configs/paper/common.py.

Compiled for its slice, compile.topology v5p:4x4x4 (experiments/compile.py at e774e8a, 2026-12-04, on a
2-core CPU host, compile-only devices): it fits, 70.9 GiB per device (5.3 of them parameters and Adam
state) of 95 GiB of HBM. 2.67e18 FLOPs a step, 91.0 s at the chips' peak (BENCHMARKS.md).
"""

from clawjax.config import config_module

paper_config = config_module(__file__, "common.py").paper_config


def get_config():
  return paper_config("claude_code")
