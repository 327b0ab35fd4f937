r"""GRPO inside Codex CLI (not a Table 1 row: the paper trains in Claude Code and OpenClaw; this is the
third harness of its transfer matrix), from the Qwen3-30B-A3B base.

32 tasks x 8 rollouts per update, 64K context, SGLang engine (GPU/TPU cluster):

  python experiments/train.py --config=configs/paper/grpo_codex_30a3b.py --config.tasks=SYNDATA \
      --config.model.init=MODEL_DIR --config.engine.url=http://SGLANG:30000 \
      --config.engine.export_dir=SHARED_DIR --workdir=runs/grpo_codex_30a3b

Codex speaks the Responses API to the shim (docs/harnesses.md); it is told the 64K window and compacts
from 48K (rollout.harness.codex_compact_reserve). Unpublished values are set and documented in
configs/paper/common.py. The learner's step is the other GRPO configs' (same model, mesh, rows), so
their compile figures hold (BENCHMARKS.md).
"""

from clawjax.config import config_module

paper_config = config_module(__file__, "common.py").paper_config


def get_config():
  return paper_config("codex")
