"""The SFT stage on two processes of this machine as two hosts (JAX's multi-controller runtime, CPU gloo
collectives, two devices each), docs/cluster.md's command, against the one-process run of this test
process on four devices, on the same data and the same 4-row updates: each process feeds two of an
update's rows, the loss is normalised over all four, so every update's nll, the held-out loss and the
exported weights equal the one-process run's to 1e-6 (float32: the gradient's partial sums are added
across processes in another order than across one process's devices, e.g. a grad_norm 1e-7 apart; the
batch's counts agree exactly). Process 0 writes metrics.jsonl and the run's files once; then
the same command with one more update resumes from the checkpoint both processes wrote and adds it."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import safetensors.numpy

from clawjax import config as config_lib
from clawjax.sft.config import sft_config
from clawjax.sft.stage import run_stage
from clawjax.train.metrics import MetricsWriter, read_metrics
from tests import processes

CONFIG = processes.ROOT / "configs" / "sft" / "cpu_small.py"
# Four rows an update over a data-parallel mesh of four devices; a constant learning rate (no warm-up,
# no decay), so that 2 updates resumed to 3 follow the 3-update run; the held-out loss after every update.
OVERRIDES = ["mesh.data=4", "warmup_ratio=0", "min_lr_ratio=1", "eval_every=1", "checkpoint_every=1",
             "progress=false", "tensorboard=false", "model.overrides.n_layers=1"]
TOL = 1e-6


def _command(workdir: pathlib.Path, steps: int, *extra: str) -> list[str]:
  return ["experiments/sft.py", f"--config={CONFIG}", f"--workdir={workdir}", f"--config.steps={steps}",
          *(f"--config.{o}" for o in OVERRIDES + list(extra))]


def _one_process(workdir: pathlib.Path, steps: int) -> None:
  """The reference: run_stage in this process, on the first four of its devices."""
  config = config_lib.config_module(str(CONFIG), CONFIG.name).get_config()
  metrics = MetricsWriter(workdir, tensorboard=False)
  try:
    run_stage(sft_config(config, OVERRIDES + [f"steps={steps}"]), workdir, metrics)
  finally:
    metrics.close()


def _weights(export: pathlib.Path) -> dict[str, np.ndarray]:
  return {k: v for f in sorted(export.glob("*.safetensors")) for k, v in safetensors.numpy.load_file(str(f)).items()}


@pytest.mark.slow  # ~90 s of CPU (2.5 min wall on 2 loaded cores): two 2-process runs, each compiling the step
def test_two_processes_equal_one_process_and_resume(tmp_path):
  _one_process(tmp_path / "one", 3)
  expected = read_metrics(tmp_path / "one", "sft")
  assert [r["step"] for r in expected] == [0, 1, 2, 3]

  workdir = tmp_path / "two"
  processes.run(_command(workdir, 2), tmp_path, "first")
  got = read_metrics(workdir, "sft")
  assert [r["step"] for r in got] == [0, 1, 2]  # process 0's lines only: one per update
  processes.run(_command(workdir, 3, "allow_config_change=true"), tmp_path, "resumed")
  got = read_metrics(workdir, "sft")
  assert [r["step"] for r in got] == [0, 1, 2, 3]  # update 3 added after the checkpoint of update 2
  assert "resuming after SFT update 2 of 3" in (tmp_path / "resumed.process_1.log").read_text()

  timing = {"time", "tokens_per_s", "step_seconds"}
  for g, e in zip(got, expected):
    assert set(g) - timing == set(e) - timing
    for name in set(e) - timing:
      # Losses to 1e-6; the rest (step, lr, and of the global batch: padding_fraction, loss_tokens,
      # conversations, which a process that fed every row, or none, would count otherwise) exactly.
      want = pytest.approx(e[name], rel=TOL) if name in ("nll", "grad_norm", "heldout_nll") else e[name]
      assert g[name] == want, (g["step"], name)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["updates"] == 3 and summary["heldout_nll"] == pytest.approx(expected[-1]["heldout_nll"], rel=TOL)
  assert json.loads((workdir / "environment.json").read_text())["jax"]["process_count"] == 2

  # The export: each process wrote its share of the tensors (one file each, and the index).
  two, one = workdir / "hf", tmp_path / "one" / "hf"
  assert sorted(p.name for p in two.glob("*.safetensors")) == [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
  a, b = _weights(two), _weights(one)
  assert sorted(json.loads((two / "model.safetensors.index.json").read_text())["weight_map"]) == sorted(a) == sorted(b)
  for name in a:
    np.testing.assert_allclose(a[name], b[name], rtol=TOL, atol=TOL, err_msg=name)
  for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    assert (two / name).read_text() == (one / name).read_text(), name
