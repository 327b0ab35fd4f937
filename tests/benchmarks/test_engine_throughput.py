"""benchmarks/engine_throughput.py at toy size: every contender answers every concurrency (here this checkout
against itself as the baseline), with the engine's dispatch counts (speeds are recorded in BENCHMARKS.md,
never asserted)."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_throughput  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.slow
def test_decode_rows_with_dispatch_counts_and_a_baseline():
  out = engine_throughput.main(["--model", "test-tiny", "--parts", "decode", "--concurrency", "1", "64",
                                "--rounds", "1", "--new-tokens", "9", "--baseline", str(ROOT)])
  one, many = out["decode"]["1"], out["decode"]["64"]
  # One request: the prefill's token, then 8 in one decode dispatch (k = 8 alone).
  assert (one["engine"]["prefill_dispatches"], one["engine"]["decode_dispatches"]) == (1, 1)
  assert one["engine"]["tokens_decoded"] == 8 and one["engine"]["rounds"][0]["tokens"] == 9
  # 64 at once: 8 decoded tokens each, in one dispatch (k = 16 under load); prefilled 32 rows a dispatch.
  assert many["engine"]["decode_dispatches"] == 1 and many["engine"]["tokens_decoded"] == 64 * 8
  assert many["engine"]["prefill_dispatches"] == 2
  for row in (one, many):
    assert row["engine"]["tok_s"] > 0 and row["baseline"]["tok_s"] > 0 and row["engine_vs_baseline"] > 0
  assert out["decode_tok_s_64"] == round(many["engine"]["tok_s"], 2)
