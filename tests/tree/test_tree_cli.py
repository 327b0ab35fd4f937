"""`python -m clawjax.tree summarize` on the bundled sample log, checked against a naive trie."""

import json
import pathlib
import subprocess
import sys

from clawjax import calllog
from clawjax.tree.__main__ import main
from clawjax.tree.filters import FilterConfig

from tests.tree.reference import NaiveTrie
from tests.tree.test_tree_filters import expected_reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "clawjax" / "data" / "sample_calls.jsonl"
KEYS = ["rollout_id", "calls", "trained_calls", "dropped", "over_branching", "leaves", "unique_tokens",
        "path_tokens", "call_tokens", "loss_tokens", "drift_calls"]
KEYS_DROPPED = ["retry", "compaction", "subagent", "auxiliary", "error"]


def summaries(capsys, *args):
  assert main(["summarize", str(SAMPLE), *args]) == 0
  return {s["rollout_id"]: s for s in map(json.loads, capsys.readouterr().out.splitlines())}


def test_summary_matches_brute_force(capsys):
  out = summaries(capsys)
  log = calllog.load(SAMPLE)
  assert sorted(out) == sorted(log.calls)
  for rid, calls in log.calls.items():
    s = out[rid]
    assert list(s) == KEYS and list(s["dropped"]) == KEYS_DROPPED
    reasons = [expected_reason(c) for c in calls]
    trained = [c for c, r in zip(calls, reasons) if r == "train"]
    naive = NaiveTrie(trained)
    leaves = naive.leaves()
    assert s["calls"] == len(calls) and s["leaves"] == len(leaves)
    assert s["over_branching"] == (len(leaves) > FilterConfig.max_leaves)
    assert s["dropped"] == {k: reasons.count(k) for k in s["dropped"]}
    if s["over_branching"]:
      trained, naive, leaves = [], NaiveTrie([]), []
    assert s["trained_calls"] == len(trained)
    assert s["unique_tokens"] == naive.size
    assert s["path_tokens"] == sum(naive.depth[l] + 1 for l in leaves)
    assert s["call_tokens"] == sum(len(c.input_ids) + len(c.output_ids) for c in trained)
    assert s["loss_tokens"] == sum(o >= 0 for o in naive.owner)
  # The sample exercises every rule.
  assert all(any(s["dropped"][k] for s in out.values()) for k in KEYS_DROPPED)
  assert any(s["over_branching"] for s in out.values())
  assert any(s["drift_calls"] for s in out.values() if not s["over_branching"])
  assert all(r.reward is not None for r in log.rollouts.values()) and set(log.rollouts) == set(out)


def test_max_leaves_flag_keeps_the_over_branching_rollout(capsys):
  default = summaries(capsys)
  relaxed = summaries(capsys, "--max-leaves", "1000")
  over = [rid for rid, s in default.items() if s["over_branching"]]
  assert over and all(not relaxed[rid]["over_branching"] and relaxed[rid]["trained_calls"] > 0
                      for rid in over)


def test_module_entry_point_prints_one_object_per_rollout():
  r = subprocess.run([sys.executable, "-m", "clawjax.tree", "summarize", str(SAMPLE)], check=True,
                     capture_output=True, text=True, cwd=ROOT)
  lines = r.stdout.splitlines()
  assert len(lines) == len(calllog.load(SAMPLE).calls) and all(list(json.loads(l)) == KEYS for l in lines)
  assert "role inferred" in r.stderr


def test_bad_log_is_reported_with_file_and_line(tmp_path, capsys):
  bad = tmp_path / "bad.jsonl"
  bad.write_text(SAMPLE.read_text().splitlines()[0].replace('"status":"ok"', '"status":"maybe"') + "\n")
  assert main(["summarize", str(bad)]) == 1
  assert f"{bad}:1" in capsys.readouterr().err


def test_sample_log_is_small_and_regenerates_identically(tmp_path):
  assert SAMPLE.stat().st_size < 200_000
  out = tmp_path / "sample.jsonl"
  subprocess.run([sys.executable, str(ROOT / "scripts" / "make_sample_log.py"), str(out)], check=True,
                 capture_output=True)
  assert out.read_bytes() == SAMPLE.read_bytes()
