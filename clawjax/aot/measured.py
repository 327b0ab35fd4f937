"""The learner's MFU as measured on real chips (scripts/device_check.py, recorded in BENCHMARKS.md), so that
experiments/compile.py can put beside its step time at the chip's peak the time at an MFU that has been
seen: a user booking a pod reads both.

A measurement is keyed by chip and model kind ("dense" or "moe") and was taken at one row length; a
config is matched to the measurement of its chip and kind whose row length is nearest its own (on a log
scale: MFU falls as rows grow, with attention's share). Chips and kinds never measured give none.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class Measured:
  chip: str
  kind: str          # "dense" | "moe"
  row_len: int
  mfu: float         # model FLOPs (3 x forward) per second over the chip's dense bf16 peak
  date: str
  what: str          # the step measured, and the clawjax commit


MEASUREMENTS: tuple[Measured, ...] = (
    Measured("h200", "dense", 8192, 0.065, "2026-12-04",
             "Qwen3-8B layers x 4, one GRPO group in an 8K tree row, blocked attention, remat (clawjax 34caf58)"),
    Measured("h200", "dense", 32768, 0.029, "2026-12-04",
             "Qwen3-8B layers x 4, one GRPO group in a 32K tree row, blocked attention, remat (clawjax 34caf58)"),
    Measured("h200", "moe", 8192, 0.0056, "2026-12-04",
             "Qwen3-30B-A3B layers x 2, one GRPO group in an 8K tree row, blocked attention, remat (clawjax 34caf58)"),
)


def lookup(chip: str, kind: str, row_len: int) -> Measured | None:
  """The measurement of `chip` and `kind` nearest `row_len`, or None where there is none."""
  found = [m for m in MEASUREMENTS if m.chip == chip and m.kind == kind]
  return min(found, key=lambda m: abs(math.log(m.row_len / row_len)), default=None)
