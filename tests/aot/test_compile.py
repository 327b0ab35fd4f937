"""experiments/compile.py on a small Qwen3-MoE step for v5e:2x2: the figures of a step that fits, and a
step too large for the chip refused in one line; for an H200, the step time also at the MFU measured on
that chip. Needs libtpu (the `tpu` extra) and XLA's CUDA compiler (the `gpu-aot` extra)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from clawjax.aot.report import Report

pytest.importorskip("libtpu", reason="compiling for TPU needs the tpu extra (pip install '.[tpu]')")

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = pathlib.Path(__file__).with_name("small_moe_config.py")


def _compile(*flags: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, str(ROOT / "experiments/compile.py"), f"--config={CONFIG}", *flags],
                        capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_small_moe_step_fits_v5e_2x2():
  done = _compile("--json")
  assert done.returncode == 0, done.stderr[-2000:]
  report = json.loads(done.stdout)
  assert report["topology"] == "v5e:2x2" and report["devices"] == 4 and report["fits"]
  assert report["attention_impl"] == "blocked" and report["remat"] and not report["extrapolated"]
  assert report["attention_lowering"] == "xla"  # "blocked" is plain XLA ops on any platform
  assert report["moe_lowering"] == "mosaic_tpu"  # megablox
  assert report["tokens_per_step"] == 8 * 512
  b = report["bytes_per_device"]
  assert b["total"] == b["arguments"] + b["outputs"] - b["aliased"] + b["temporaries"] > 0
  assert b["total"] <= report["hbm_bytes_per_device"] == 16 * 1024 ** 3
  # Every token runs forward and backward through every active parameter at least once.
  assert report["flops_per_step"] >= 6 * report["active_params"] * report["tokens_per_step"]
  assert report["compiler_flops_per_step"] > 0 and report["est_step_s"] > 0 and 0 < report["mfu"] <= 1
  # No MFU has been measured on a v5e: only the time at peak, and the text says so.
  assert report["measured_mfu"] is None is report["est_step_s_at_measured_mfu"] is report["measured"]


@pytest.mark.slow
def test_h200_step_time_at_the_measured_mfu():
  pytest.importorskip("jax_cuda12_plugin", reason="compiling for GPUs needs the gpu-aot extra")
  done = _compile("--json", "--topology=h200:1x1x1")
  assert done.returncode == 0, done.stderr[-2000:]
  report = json.loads(done.stdout)
  assert report["attention_lowering"] == "xla" and report["moe_lowering"] == "mosaic_gpu"  # blocked; bf16 experts
  seen = report["measured"]
  assert seen["chip"] == "h200" and seen["kind"] == "moe" and seen["date"] and seen["mfu"] == report["measured_mfu"]
  # The same model FLOPs at the measured MFU instead of at the chip's peak.
  assert report["est_step_s_at_measured_mfu"] == pytest.approx(
      report["model_flops_per_step"] / (989e12 * report["measured_mfu"]))
  assert report["est_step_s_at_measured_mfu"] > report["est_step_s"]
  text = Report(**report).text()  # what the command prints without --json
  assert f"at the MFU measured on h200 ({report['measured_mfu']:.1%}, moe" in text, text


@pytest.mark.slow
def test_oversized_step_is_refused_in_one_line():
  # 2M tokens of 512-token rows through the 151K-entry Qwen3 vocabulary: more than a v5e's 16 GiB.
  done = _compile("--config.batch.rows=4096", "--config.model.overrides.vocab_size=151936")
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith("error: does not fit v5e:2x2: the step needs ") and "16.0 GiB of HBM" in last, done.stderr[-2000:]
