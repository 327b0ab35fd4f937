"""The benchmark scripts keep running at toy sizes, and what they report is self-consistent (their
speed numbers are recorded in BENCHMARKS.md, never asserted in tests)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learner_tree_vs_paths  # noqa: E402  pylint: disable=wrong-import-position
import loss_step  # noqa: E402  pylint: disable=wrong-import-position


@pytest.mark.parametrize("share", [False, True])
def test_learner_benchmark_tree_and_paths_agree(share):
  out = learner_tree_vs_paths.main(
      ["--preset", "test-tiny", "--layers", "1", "--rollouts", "2", "--prompt-len", "48", "--calls", "4",
       "--tokens-per-call", "16", "--attention-block", "64", "--repeats", "1", "--row-len", "512"]
      + ["--share-prompts"] * share)
  assert out["tree_rows"] == (1 if share else 2)  # sharing merges the group into one row
  assert out["max_rel_loss_diff"] < 1e-5 and out["max_rel_grad_diff"] < 1e-5
  assert out["paths_tokens"] > out["tree_tokens"] > 0
  assert 1 < out["attention_ratio"] <= out["ideal_ratio"]
  assert 1 <= out["flop_ratio"] <= out["ideal_ratio"]  # (logits at loss tokens cost the same in both)
  assert 0 < out["tree_attention_flop_share"] < 1 and out["tree_step_s"] > 0 and out["paths_step_s"] > 0


@pytest.mark.slow  # three learners compile (about 90 s on a loaded machine)
def test_loss_step_benchmark_times_every_loss_against_the_first():
  out = loss_step.main(["--groups", "2", "--rollouts", "2", "--prompt-len", "24", "--calls", "2",
                        "--tokens-per-call", "8", "--row-len", "256", "--vocab", "256", "--layers", "1",
                        "--logits-chunk", "32", "--repeats", "1"])
  assert set(out["step_s"]) == {"grpo", "gspo", "cispo"} and min(out["step_s"].values()) > 0
  assert out["ratio_to_grpo"]["grpo"] == out["paired_ratio_to_grpo"]["grpo"] == 1.0
  assert out["rows"] >= 1 and out["loss_tokens"] > 0


# Rounds per concurrency: the medians compared below (a hop's ~1 ms against a 12 ms call) must stand above
# the machine's noise; 3 rounds gave a hop median under the direct one on a loaded machine.
ROUNDS = "9"


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--raw-hop"],
                                  ["--incremental-stream", "--variant-flag=--gc-threshold=0"]],
                         ids=["whole-with-raw-hop", "incremental-with-variant"])
def test_shim_benchmark_reports_every_level(mode):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "shim_overhead.py"), "--json",
                         "--concurrency", "1", "2", "--rounds", ROUNDS, "--prior-calls", "3",
                         "--engine-latency-s", "0.01", *mode], capture_output=True, text=True,
                        timeout=300, env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = json.loads(proc.stdout)
  incremental = "--incremental-stream" in mode
  assert report["incremental_stream"] == incremental and report["raw_hop"] == (not incremental)
  assert [r["concurrency"] for r in report["results"]] == [1, 2]
  for r in report["results"]:
    assert r["samples"] == int(ROUNDS) * r["concurrency"] and r["context_tokens"] > 1000
    assert r["shim_ms"]["p50"] > r["in_shim_before_fsync_ms"]["p50"] > 0
    assert r["hop_ms"]["p50"] > r["direct_ms"]["p50"] > 0
    # The hop without an HTTP library answered (the client checks for a 200) after the engine's 10 ms.
    assert ("raw_hop_ms" in r) == (not incremental)
    if not incremental:
      assert r["raw_hop_ms"]["p50"] > 10
    # Compact call-log lines: the rollout's 7 calls (~20K-token contexts, ~7 bytes an id) log about
    # one context in full; writing each input whole would take ~7 contexts.
    assert r["log_bytes_per_rollout"] < 2 * 7 * r["context_tokens"]
    # The variant shim (another process, its own rollouts) was measured in the same rounds.
    assert ("variant_ms" in r) == incremental
    if incremental:
      assert r["variant_ms"]["p50"] > r["variant_in_shim_before_fsync_ms"]["p50"] > 0
      assert r["variant_cpu_ms_per_call"] > 0 and set(r["cpu_ms_per_round"]) >= {"shim", "variant"}


@pytest.mark.slow
def test_sft_throughput_benchmark_packs_the_same_tokens_with_less_padding():
  import sft_throughput  # pylint: disable=import-outside-toplevel
  out = sft_throughput.main(["--conversations", "24", "--median-len", "60", "--row-len", "512", "--rows", "2",
                             "--d-model", "64", "--layers", "1", "--vocab", "512", "--attention-block", "128",
                             "--logits-chunk", "32"])
  packed, unpacked = out["packed"], out["unpacked"]
  assert packed["tokens"] == unpacked["tokens"] > 0  # the same conversations, every one once
  assert unpacked["batches"] == 12 and packed["batches"] < unpacked["batches"]
  assert 0 <= packed["padding_fraction"] < unpacked["padding_fraction"] < 1
  assert packed["tokens_per_s"] > 0 and unpacked["tokens_per_s"] > 0 and out["speedup"] > 0


@pytest.mark.slow
def test_logprob_gap_benchmark_by_cache_dtype():
  import engine_logprob_gap  # pylint: disable=import-outside-toplevel
  out = engine_logprob_gap.main(["--toy", "--requests", "2", "--new-tokens", "6"])
  rows = {(r["compute_dtype"], r["cache_dtype"]): r for r in out["rows"]}
  assert all(r["tokens"] == 12 for r in rows.values())
  exact, rounded = rows["float32", "float32"], rows["float32", "bfloat16"]
  assert exact["max_abs_logp_old_minus_rollout"] < 1e-4 < rounded["max_abs_logp_old_minus_rollout"]
  # bfloat16 compute: its keys and values are bfloat16 already, so the cache's dtype changes nothing.
  assert rows["bfloat16", "float32"] == {**rows["bfloat16", "bfloat16"], "cache_dtype": "float32",
                                         "seconds": rows["bfloat16", "float32"]["seconds"]}
