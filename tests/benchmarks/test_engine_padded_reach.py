"""benchmarks/engine_padded_reach.py at toy size: the key blocks each reach rule reads, and the padded batch's
dispatches (speeds are recorded in BENCHMARKS.md, never asserted)."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_padded_reach  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.slow
def test_both_reach_rules_and_the_padded_batch():
  out = engine_padded_reach.main(["--model", "test-tiny", "--max-seq-len", "2048", "--long-len", "600",
                                  "--other-len", "520", "--new-tokens", "4", "--rounds", "1", "--repeats", "1"])
  for kind in ("decode", "prefill"):
    row = out["attention"][kind]
    # The padding row at 2,559 (2,048 + 512 - 1) reached block 4; the real rows reach position 599, block 1.
    assert (row["before"]["blocks"], row["now"]["blocks"]) == (5, 2) and row["cache_len"] == 1024
    assert row["before"]["kv_bytes_per_row"] == 5 * 512 * 2 * 2 * 16 * 4  # keys and values, 2 kv heads of 16
    assert row["before"]["ms"] > 0 and row["now"]["ms"] > 0
  (timed,) = out["dispatch"]["now"]["rounds"]
  # The three prompts' first chunks in one dispatch, their rests (3 rows, padded to 4) in a second.
  assert timed["prefill_dispatches"] == 2 and timed["tokens"] == 3 * 4 and timed["decode_tok_s"] > 0
