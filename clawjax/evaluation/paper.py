"""The paper's Table 1 (ClawGym II, arXiv 2608.16798): mean final score in percent per benchmark.

Rows are (harness, model) as the paper names them; an evaluation run matches a row when its harness
(adapter name, e.g. "openclaw") displays as the row's harness and its `model_label` equals the row's
model. The paper publishes no per-category numbers.
"""

from __future__ import annotations

PINCHBENCH = "PinchBench"
CLAWGYM_BENCH = "ClawGym-Bench"
BENCHMARKS = (PINCHBENCH, CLAWGYM_BENCH)  # the paper's column order

# Harness names (clawjax.harness.adapters, the call log's `harness`) -> the paper's spelling.
HARNESS_DISPLAY = {"openclaw": "OpenClaw", "claude_code": "Claude Code", "codex": "Codex"}

# (harness, model) -> {benchmark: score}
TABLE1: dict[tuple[str, str], dict[str, float]] = {
    ("OpenClaw", "Qwen3-30A3B"): {PINCHBENCH: 55.60, CLAWGYM_BENCH: 45.11},
    ("OpenClaw", "ClawII-Cold-30A3B"): {PINCHBENCH: 75.61, CLAWGYM_BENCH: 52.64},
    ("OpenClaw", "ClawII-OC-30A3B"): {PINCHBENCH: 87.32, CLAWGYM_BENCH: 62.62},
    ("OpenClaw", "ClawII-Cold-8B"): {PINCHBENCH: 71.29, CLAWGYM_BENCH: 47.06},
    ("OpenClaw", "ClawII-OC-8B"): {PINCHBENCH: 77.44, CLAWGYM_BENCH: 54.98},
    ("Claude Code", "Qwen3-30A3B"): {PINCHBENCH: 54.14, CLAWGYM_BENCH: 37.06},
    ("Claude Code", "ClawII-CC-30A3B"): {PINCHBENCH: 71.42, CLAWGYM_BENCH: 51.87},
    ("Claude Code", "Qwen3-8B"): {PINCHBENCH: 27.40, CLAWGYM_BENCH: 18.54},
    ("Claude Code", "ClawII-CC-8B"): {PINCHBENCH: 61.21, CLAWGYM_BENCH: 42.05},
}


def harness_display(harness: str) -> str:
  return HARNESS_DISPLAY.get(harness, harness)
