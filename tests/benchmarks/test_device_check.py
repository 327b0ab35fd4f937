"""scripts/device_check.sh --small: the accelerator check's CPU run (tiny preset, short rows, SGLang
skipped) writes one JSON whose every part is accounted for, with sane numbers. ~30 s on a quiet
machine: each part is a child process that compiles its own programs."""
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_small_check_writes_every_part(tmp_path):
  out = tmp_path / "check.json"
  env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--small", "--out", str(out)],
                        capture_output=True, text=True, timeout=900, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(out.read_text())
  assert report["small"] is True and report["wall_s"] > 0 and report["environment"]["python"]
  parts = report["parts"]
  assert set(parts) == {"learner_mfu", "pallas", "engine_decode", "sglang"}
  assert parts["sglang"]["status"] == "skipped" and "GPU" in parts["sglang"]["reason"]
  learner = parts["learner_mfu"]
  assert learner["status"] == "ok", learner
  result = learner["result"]
  assert result["peak_bf16_flops"] is None  # a CPU: no MFU, FLOP/s still reported
  for row in result["rows"].values():
    tree, paths = row["tree"], row["paths"]
    assert paths["tokens"] > tree["tokens"] > 0 and paths["rows"] > tree["rows"] == 1
    for layout in (tree, paths):
      assert layout["step_s"] > 0 and layout["flops"] > 0 and layout["mfu"] is None
      assert math.isfinite(layout["loss"])
    assert paths["flops"] > tree["flops"] and row["tree_speedup"] > 0
  # The Pallas kernel: measured when registered, else recorded as unavailable with the reason.
  pallas = parts["pallas"]
  assert pallas["status"] in ("ok", "unavailable")
  if pallas["status"] == "ok":
    assert pallas["result"]["loss_rel_diff"] < 1e-2 and pallas["result"]["pallas_speedup"] > 0
  else:
    assert "pallas" in pallas["reason"]
  engine = parts["engine_decode"]
  assert engine["status"] == "ok", engine
  assert engine["result"]["decode_tok_s_1"] > 0 and engine["result"]["decode_1_detail"]["tokens"] == 4


def test_parts_past_the_deadline_are_recorded_as_skipped(tmp_path):
  """Out of device time: each part left is recorded as skipped, and the JSON is written all the same."""
  out = tmp_path / "check.json"
  proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--small", "--out", str(out),
                         "--deadline-s", "5"], capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert proc.returncode == 0, proc.stderr[-3000:]
  parts = json.loads(out.read_text())["parts"]
  assert {p["status"] for p in parts.values()} == {"skipped"} and len(parts) == 4
  assert parts["learner_mfu"]["reason"] == "out of time"


@pytest.mark.slow
def test_the_sglang_part_against_an_engine_that_speaks_sglangs_api(tmp_path, monkeypatch):
  """The SGLang part's client side on the CPU: clawjax's engine server (SGLang's API) in place of
  `sglang.launch_server` and test-tiny in place of qwen3-0.6b; served log-probs, one push, its version."""
  sys.path.insert(0, str(ROOT / "scripts"))
  import device_check  # pylint: disable=import-outside-toplevel
  from clawjax.models import loading  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends import base  # pylint: disable=import-outside-toplevel
  load, create, popen = loading.load_model, base.create_backend, subprocess.Popen
  monkeypatch.setenv("CLAWJAX_ADMIN_TOKEN", "test-admin")  # our server guards its weight update
  monkeypatch.setattr(loading, "load_model", lambda spec, **kw: load("test-tiny", **kw))
  monkeypatch.setattr(base, "create_backend", lambda name, **kw: create(name, admin_api_key="test-admin", **kw))

  def engine_server(cmd, **kw):
    model, port = cmd[cmd.index("--model-path") + 1], cmd[cmd.index("--port") + 1]
    return popen([sys.executable, "-m", "clawjax.engine", "--model", model, "--port", port], **kw)

  monkeypatch.setattr(device_check.subprocess, "Popen", engine_server)
  out = device_check.part_sglang(False, sys.executable, tmp_path, budget_s=300)
  assert out["status"] == "ok", out
  assert out["weight_version_read_back"] == 1 == out["generation_policy_version"]
  assert out["push_bytes"] > 0 and out["update_weights_from_disk_s"] > 0
  for key in ("logprobs_v0", "logprobs_v1"):
    # The server computes in f32 from the bf16 export, the model in bf16: close, not equal.
    assert out[key]["tokens"] == 32 and out[key]["max_abs_diff"] < 0.2
