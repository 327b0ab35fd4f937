"""scripts/device_check.sh --small: the accelerator check's CPU run (tiny presets, short rows) leaves its
report and one archive of the parts' files, every part accounted for, with sane numbers; parts past the
deadline are recorded as skipped; the budgets fit one command on a lent machine; a learner step records its
compile and first step as soon as each is known; the peer's long row is sized to the device's memory. And
scripts/sglang_check.py's client flow against clawjax's engine server, which speaks SGLang's API."""
import json
import math
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

from clawjax.models.config import preset

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_check  # noqa: E402  pylint: disable=wrong-import-position
import torch_peer  # noqa: E402  pylint: disable=wrong-import-position

# The CPU run's own deadline, not the GPU's 505 s for all eleven parts: these took 333 s on a loaded 2-core
# machine, two of them over 240 s each at a load of 20.
CPU_DEADLINE_S = 1500


# Every part but the two that time learner_8k's step again with other settings (`variants_8k`: other
# attention kernels and remat off, `cublas_8k`: a GPU compiler flag): the same function as learner_8k's tree
# step, compiled four more times on the CPU.
SMALL_PARTS = ["environment", "kernels", "learner_8k", "torch_8k", "moe_8k", "learner_32k", "torch_32k",
               "engine_decode", "profile_8k"]


@pytest.mark.slow
@pytest.mark.timeout(CPU_DEADLINE_S + 400)  # past pytest.ini's 900 s: the run's own deadline and a margin
def test_small_check_writes_every_part(tmp_path):
  out = tmp_path / "check"
  env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT))
  proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--small", "--out", str(out),
                         "--deadline-s", str(CPU_DEADLINE_S), "--parts", *SMALL_PARTS], capture_output=True,
                        text=True, timeout=CPU_DEADLINE_S + 300, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert sorted(p.name for p in out.iterdir()) == ["device_check.json", "parts.tar.gz"]  # a report and one archive
  report = json.loads((out / "device_check.json").read_text())
  parts = report["parts"]
  assert report["small"] is True and report["wall_s"] > 0 and report["deadline_s"] == CPU_DEADLINE_S
  assert list(parts) == SMALL_PARTS
  assert {name: p["status"] for name, p in parts.items()} == {name: "ok" for name in parts}, parts
  results = {name: p["result"] for name, p in parts.items()}
  # Each part's own file, in the archive with its log, holds what the report holds.
  with tarfile.open(out / "parts.tar.gz") as archive:
    assert sorted(archive.getnames()) == sorted(f"parts/{n}.{x}" for n in SMALL_PARTS for x in ("json", "log"))
    for name, result in results.items():
      assert json.loads(archive.extractfile(f"parts/{name}.json").read()) == result
  assert results["environment"]["python"]["version"]
  peer_packages = results["environment"]["peer_packages"]
  assert peer_packages["torch"] and peer_packages["transformers"] and set(device_check.PEER_PACKAGES) == set(peer_packages)

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
    assert tree["first_step_s"] > tree["compile_s"]["xla_s"] > 0
    assert tree["mfu"] is None  # the CPU: no peak to measure against, FLOP/s still reported
  tree, paths = results["learner_8k"]["tree"], results["learner_8k"]["paths"]
  assert paths["tokens"] > tree["tokens"] and paths["rows"] > tree["rows"] == 1 and paths["flops"] > tree["flops"]
  for name in ("torch_8k", "torch_32k"):
    peer = results[name]
    assert peer["tokens_per_s"] > 0 and peer["flops"] > 0 and peer["device"] == "cpu"
  assert results["torch_32k"]["row_len"] == 2 * results["torch_8k"]["row_len"] == results["torch_32k"]["requested_row_len"]

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


def test_the_budgets_fit_one_command_slowest_to_matter_last():
  """The default deadline is the parts' budgets added up, and with the margin for the wheels, starting and
  packing it fits one 10-minute command on a lent machine; the diagnostic parts run last."""
  assert device_check.DEADLINE_S == sum(device_check.BUDGET_S.values())
  assert device_check.DEADLINE_S + device_check.MARGIN_S <= device_check.COMMAND_S == 600
  assert device_check.PARTS[:3] == ("environment", "kernels", "learner_8k")
  assert device_check.PARTS[-3:] == ("profile_8k", "cublas_8k", "variants_8k")


def test_a_part_cut_off_keeps_what_it_recorded(tmp_path):
  """A part killed at its time limit: its figures so far are in the report, its status says timeout."""
  (tmp_path / "learner_8k.json").write_text(json.dumps({"tree": {"step_s": 1.0}}))
  args = device_check.argparse.Namespace(work=str(tmp_path), small=True, cache_dir=str(tmp_path / "cache"))
  # A budget too short for the part's child to finish: it is killed, and the file it had written survives.
  record = device_check._run_part("learner_8k", args, budget_s=0.5)
  assert record["status"] == "timeout" and record["result"] == {"tree": {"step_s": 1.0}}
  assert (tmp_path / "learner_8k.log").exists()


def test_a_learner_step_records_its_compile_and_first_step_as_each_is_known(tmp_path, monkeypatch):
  """What a learner part writes while it runs: the compile's seconds once XLA has compiled the step (before
  the step has run), then the first step's, then the timed steps: a part cut off by its limit keeps each.
  (Every compile counts as long here: the tiny step may compile in under the GPU's second.)"""
  monkeypatch.setattr(device_check.CompileClock, "LONG_S", 0.0)
  cfg = device_check._model_cfg(True)
  tree, _ = device_check._group(512, 2, seed=512)
  rec = device_check.Recorder(tmp_path / "learner_8k.json")
  seen = []
  put = rec.put
  rec.put = lambda **items: seen.append(json.loads(json.dumps(items["tree"]))) or put(**items)
  device_check._timed_into(rec, "tree", cfg, tree, micro_batches=1, repeats=1, small=True)
  compiled = next(i for i, f in enumerate(seen) if "compile_s" in f)
  first = next(i for i, f in enumerate(seen) if "first_step_s" in f)
  assert compiled < first and "step_s" not in seen[first] and seen[first - 1]["compile_s"]["xla_s"] > 0
  assert seen[first]["compile_s"]["xla_s"] >= seen[first - 1]["compile_s"]["xla_s"]
  assert seen[-1]["step_s"] > 0 and json.loads((tmp_path / "learner_8k.json").read_text())["tree"] == seen[-1]


def test_the_peers_long_row_is_sized_to_the_device_or_skipped(tmp_path, monkeypatch):
  """torch_32k: the peer's 32K step (Qwen3-8B x 4) needs more than an H100's 80 GB, f32 log-probs over
  32,767 x 151,936 alone being 19.9 GB: it runs at the longest row that fits; on an H200 at 32K; on a
  device too small for any row it is skipped with the reason."""
  cfg = preset("qwen3-8b", n_layers=4)
  assert 32_767 * cfg.vocab_size * 4 / 1e9 == pytest.approx(19.9, abs=0.05)
  h100, h200 = 80 * 2 ** 30, 141 * 10 ** 9
  assert torch_peer.step_bytes(cfg, 32_768) > 0.9 * h100
  sized = torch_peer.fitting_row_len(cfg, 32_768, h100)
  assert 8192 <= sized < 32_768 and sized % 1024 == 0
  assert torch_peer.step_bytes(cfg, sized) <= 0.9 * h100 < torch_peer.step_bytes(cfg, sized + 1024)
  assert torch_peer.fitting_row_len(cfg, 32_768, h200) == 32_768
  monkeypatch.setattr(torch_peer, "device_memory_bytes", lambda: 2 ** 20)
  monkeypatch.setattr(torch_peer, "peer_step", lambda *a, **kw: pytest.fail("a skipped part ran the peer"))
  rec = device_check.Recorder(tmp_path / "torch_32k.json")
  device_check.part_torch_32k(rec, small=True)
  assert rec.data["skipped"].startswith("the peer's step needs ~") and rec.data["requested_row_len"] == 1024


@pytest.mark.slow
def test_the_sglang_check_against_an_engine_that_speaks_sglangs_api(tmp_path, monkeypatch):
  """scripts/sglang_check.py's client side on the CPU: clawjax's engine server (SGLang's API) in place of
  `sglang.launch_server` and test-tiny in place of qwen3-0.6b; served log-probs, one push, its version, and
  the pushes with a call in flight."""
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
