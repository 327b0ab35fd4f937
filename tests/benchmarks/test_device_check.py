"""scripts/device_check.sh --small: the accelerator check's CPU run (tiny presets, short rows) writes a JSON
per part as it goes and device_check.json after each part, every part accounted for, with sane numbers;
parts past the deadline are recorded as skipped. And scripts/sglang_check.py's client flow against
clawjax's engine server, which speaks SGLang's API."""
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


# Every part but the two that time learner_8k's step again with other settings (`variants_8k`: other
# attention kernels and remat off, `cublas_8k`: a GPU compiler flag): the same function as learner_8k's tree
# step, compiled four more times on the CPU.
SMALL_PARTS = ["environment", "kernels", "learner_8k", "torch_8k", "moe_8k", "learner_32k", "torch_32k",
               "engine_decode", "profile_8k"]


@pytest.mark.slow
def test_small_check_writes_every_part(tmp_path):
  out = tmp_path / "check"
  env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--small", "--out", str(out),
                         "--parts", *SMALL_PARTS], capture_output=True, text=True, timeout=1500, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads((out / "device_check.json").read_text())
  parts = report["parts"]
  assert report["small"] is True and report["wall_s"] > 0
  assert list(parts) == SMALL_PARTS
  assert {name: p["status"] for name, p in parts.items()} == {name: "ok" for name in parts}, parts
  results = {name: p["result"] for name, p in parts.items()}
  # Each part's own file holds what the report holds.
  for name, result in results.items():
    assert json.loads((out / f"{name}.json").read_text()) == result
  assert results["environment"]["python"]["version"]

  # The kernel checked against dense float32 attention: float32 close, bf16 within its rounding.
  attention = results["kernels"]["attention"]
  assert max(attention["float32"].values()) < 1e-4 and max(attention["bfloat16"].values()) < 5e-2, attention
  moe = results["kernels"]["moe"]
  assert moe["kernel"] == "megablox_interpret" and moe["ragged_bf16"]["kernel_dx"] < 8e-3, moe  # NaN rows leak nothing
  timed = results["kernels"]["attention_8k_tile64"]
  assert timed["pallas"]["attention_lowering"] == "interpret" and timed["pallas"]["step_s"] > 0 and timed["blocked"]["step_s"] > 0

  for name in ("learner_8k", "learner_32k", "moe_8k"):
    tree = results[name]["tree"]
    assert tree["step_s"] > 0 and tree["tokens"] > 0 and tree["flops"] > 0 and math.isfinite(tree["loss"])
    assert tree["mfu"] is None  # the CPU: no peak to measure against, FLOP/s still reported
  tree, paths = results["learner_8k"]["tree"], results["learner_8k"]["paths"]
  assert paths["tokens"] > tree["tokens"] and paths["rows"] > tree["rows"] == 1 and paths["flops"] > tree["flops"]
  for name in ("torch_8k", "torch_32k"):
    peer = results[name]
    assert peer["tokens_per_s"] > 0 and peer["flops"] > 0 and peer["device"] == "cpu"
  assert results["torch_32k"]["row_len"] == 2 * results["torch_8k"]["row_len"]

  summary = report["summary"]
  for label in ("8k", "32k"):
    ratio = results[f"learner_{label}"]["tree"]["tokens_per_s"] / results[f"torch_{label}"]["tokens_per_s"]
    assert summary[f"tree_vs_torch_tokens_per_s_{label}"] == pytest.approx(ratio)
  assert summary["group_vs_torch_on_paths_8k"] == pytest.approx(
      paths["tokens"] / results["torch_8k"]["tokens_per_s"] / tree["step_s"])

  engine = results["engine_decode"]
  for concurrency in (1, 4):
    assert engine[f"decode_{concurrency}"]["tokens"] == concurrency * engine["new_tokens"]
  assert results["profile_8k"]["device_events"] == 0  # the CPU backend traces host events only


def test_the_variant_parts_time_the_same_step(tmp_path, monkeypatch):
  """variants_8k and cublas_8k: learner_8k's tree step with other kernels, remat off, a compiler flag;
  their timings stand in for compiles here (the step is the same function as learner_8k's)."""
  sys.path.insert(0, str(ROOT / "scripts"))
  import device_check  # pylint: disable=import-outside-toplevel
  steps = []
  monkeypatch.setattr(device_check, "timed_step", lambda cfg, batch, **kw: steps.append((cfg, batch, kw)) or {})
  rec = device_check.Recorder(tmp_path / "v.json")
  device_check.part_variants_8k(rec, small=True)
  device_check.part_cublas_8k(rec, small=True)
  assert set(rec.data) == {"blocked", "dense", "no_remat", "xla_flags", "device_kind", "preset", "layers", "row_len",
                           "attention_impl", "tree"}
  (blocked, dense, no_remat, cublas) = steps
  assert (blocked[0].attention_impl, dense[0].attention_impl, no_remat[0].remat) == ("blocked", "dense", False)
  assert cublas[0] == device_check._model_cfg(True) and no_remat[0] == cublas[0].replace(remat=False)
  assert all(step[1].tokens_RT.shape == cublas[1].tokens_RT.shape for step in steps)  # one 8K tree row
  assert device_check.PART_XLA_FLAGS["cublas_8k"] == rec.data["xla_flags"] == "--xla_gpu_enable_triton_gemm=false"


def test_parts_past_the_deadline_are_recorded_as_skipped(tmp_path):
  """Out of device time: each part left is recorded as skipped, and the JSON is written all the same."""
  proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--small", "--out", str(tmp_path),
                         "--deadline-s", "5"], capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert proc.returncode == 0, proc.stderr[-3000:]
  parts = json.loads((tmp_path / "device_check.json").read_text())["parts"]
  assert {p["status"] for p in parts.values()} == {"skipped"} and len(parts) == 11
  assert parts["learner_8k"]["reason"] == "out of time"


def test_a_part_cut_off_keeps_what_it_recorded(tmp_path):
  """A part killed at its time limit: its figures so far are in the report, its status says timeout."""
  sys.path.insert(0, str(ROOT / "scripts"))
  import device_check  # pylint: disable=import-outside-toplevel
  (tmp_path / "learner_8k.json").write_text(json.dumps({"tree": {"step_s": 1.0}}))
  args = device_check.argparse.Namespace(out=str(tmp_path), small=True, cache_dir=str(tmp_path / "cache"))
  # A budget too short for the part's child to finish: it is killed, and the file it had written survives.
  record = device_check._run_part("learner_8k", args, budget_s=0.5)
  assert record["status"] == "timeout" and record["result"] == {"tree": {"step_s": 1.0}}


@pytest.mark.slow
def test_the_sglang_check_against_an_engine_that_speaks_sglangs_api(tmp_path, monkeypatch):
  """scripts/sglang_check.py's client side on the CPU: clawjax's engine server (SGLang's API) in place of
  `sglang.launch_server` and test-tiny in place of qwen3-0.6b; served log-probs, one push, its version, and
  the pushes with a call in flight."""
  sys.path.insert(0, str(ROOT / "scripts"))
  import sglang_check  # pylint: disable=import-outside-toplevel
  from clawjax.models import loading  # pylint: disable=import-outside-toplevel
  from clawjax.serving.backends import base  # pylint: disable=import-outside-toplevel
  load, create, popen = loading.load_model, base.create_backend, subprocess.Popen
  monkeypatch.setenv("CLAWJAX_ADMIN_TOKEN", "test-admin")  # our server guards its weight update
  monkeypatch.setattr(loading, "load_model", lambda spec, **kw: load("test-tiny", **kw))
  monkeypatch.setattr(base, "create_backend", lambda name, **kw: create(name, admin_api_key="test-admin", **kw))

  def engine_server(cmd, **kw):
    model, port = cmd[cmd.index("--model-path") + 1], cmd[cmd.index("--port") + 1]
    return popen([sys.executable, "-m", "clawjax.engine", "--model", model, "--port", port], **kw)

  monkeypatch.setattr(sglang_check.subprocess, "Popen", engine_server)
  out = sglang_check.check_sglang(sys.executable, tmp_path, budget_s=300)
  assert out["status"] == "ok", out
  assert out["weight_version_read_back"] == 1 == out["generation_policy_version"] and out["same_seed_same_tokens"]
  # Pushes with a call in flight: drained (it ends on the weights it started with), then aborted.
  assert out["push_draining"]["version_read_back"] == 2 and out["push_draining"]["call_version"] == 1
  assert out["push_aborting"]["version_read_back"] == 3
  assert out["push_aborting"].get("call_error", {"retryable": True})["retryable"]
  assert out["push_bytes"] > 0 and out["update_weights_from_disk_s"] > 0
  for key in ("logprobs_v0", "logprobs_v1"):
    # The server computes in f32 from the bf16 export, the model in bf16: close, not equal.
    assert out[key]["tokens"] == 32 and out[key]["max_abs_diff"] < 0.2
