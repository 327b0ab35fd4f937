"""benchmarks/weight_push.py at toy sizes: the push's export in bf16 is half the f32 bytes with the same
tensors, the changed-values count is exact, and the 30B extrapolation is derived from what was measured
(speeds are recorded in BENCHMARKS.md, never asserted)."""
import pathlib
import sys

import ml_dtypes
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import weight_push  # noqa: E402  pylint: disable=wrong-import-position


def test_export_part_and_its_extrapolation(tmp_path):
  out = weight_push.main(["--parts", "export", "--export-layers", "1", "--export-experts", "2",
                          "--export-vocab", "512", "--repeats", "1", "--workdir", str(tmp_path)])
  export = out["export"]
  assert export["push_dtype"] == "bfloat16"
  f32, bf16 = export["f32"], export["bf16"]
  assert f32["tensors"] == bf16["tensors"] > 0
  assert abs(bf16["bytes"] / f32["bytes"] - 0.5) < 0.01  # the headers are all that is not halved
  assert min(f32["save_bytes_per_s"], bf16["save_bytes_per_s"], bf16["read_bytes_per_s"]) > 0
  x = out["extrapolation_30b"]
  assert x["extrapolation"] is True and x["bf16_bytes"] == x["f32_bytes"] / 2
  assert x["bf16_save_s"] == round(x["bf16_bytes"] / bf16["save_bytes_per_s"], 1)
  assert list(tmp_path.iterdir()) == []  # the exports are removed


def test_changes_count_bf16_values_and_whole_tensors():
  before = {"a": np.zeros((4, 4), ml_dtypes.bfloat16), "b": np.ones(8, ml_dtypes.bfloat16)}
  after = {k: v.copy() for k, v in before.items()}
  after["a"][0, 0] = 1e-3
  after["a"][1, 1] = -0.0  # another bit pattern: a change the engine would receive
  c = weight_push._changes(before, after)  # pylint: disable=protected-access
  assert c["values_changed_fraction"] == 2 / 24 and c["tensors_changed_fraction"] == 0.5
  assert c["bytes_in_changed_tensors_fraction"] == 32 / 48 and c["bf16_bytes"] == 48


def test_device_move_part_and_its_extrapolation():
  """The learner's f32 weights on 4 of the 8 CPU devices into an engine's bf16 shardings on the other 4."""
  out = weight_push.main(["--parts", "device_move", "--export-layers", "1", "--export-experts", "2",
                          "--export-vocab", "512", "--repeats", "1"])
  move = out["device_move"]
  assert (move["learner_devices"], move["engine_devices"], move["dtype"]) == (4, 4, "bfloat16")
  assert move["bytes"] == move["learner_bytes"] // 2 and move["bytes_per_s"] > 0
  assert move["bytes"] / 4 <= move["bytes_per_engine_device"] < move["bytes"]  # split, some of it replicated
  x = out["extrapolation_30b"]["device_move"]
  assert x["engine_bytes"] == round(weight_push.QWEN3_30B_A3B_PARAMS * move["bytes"] / move["params"])
  assert x["nvlink4_h100_h200_s"] == round(x["bytes_per_engine_device"] / 450e9, 3)
