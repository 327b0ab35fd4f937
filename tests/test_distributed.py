"""The learner across processes: DistributedConfig, the host collectives, and a real 2-process run on
localhost (jax.distributed with the CPU gloo collectives, 4 devices each) against the 1-process 8-device
learner of this test process on the same global batch."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from clawjax import distributed, sharding
from clawjax.config import ConfigError
from clawjax.models import hf_io
from clawjax.rl.learner import Learner
from clawjax.rl.value import make_value_model
from tests import distributed_worker as worker
from tests.ports import free_port
from tests.rl.learner_batches import TINY, make_policy, rel_diff, stack_rows

REPO = pathlib.Path(__file__).resolve().parents[1]
TOL = 1e-6


@pytest.mark.parametrize("fields,field", [
    (dict(num_processes=2, process_id=0), "num_processes"),
    (dict(coordinator="10.0.0.1:1234", num_processes=2), "process_id"),
    (dict(coordinator="10.0.0.1:1234", num_processes=2, process_id=2), "process_id"),
    (dict(coordinator="10.0.0.1:1234"), "coordinator"),
    (dict(coordinator="10.0.0.1", num_processes=2, process_id=0), "coordinator"),
    (dict(coordinator="10.0.0.1:99999", num_processes=2, process_id=0), "coordinator"),
    (dict(num_processes=0), "num_processes"),
    (dict(process_id=1), "process_id"),
    (dict(cpu_collectives="nccl"), "cpu_collectives"),
    (dict(initialization_timeout_s=0), "initialization_timeout_s"),
])
def test_config_errors_name_the_field(fields, field):
  with pytest.raises(ConfigError, match=rf"config\.distributed\.{field}:"):
    distributed.DistributedConfig(**fields)


def test_valid_configs():
  assert not distributed.DistributedConfig().multi_process
  assert not distributed.DistributedConfig(num_processes=1, process_id=0).multi_process
  assert distributed.DistributedConfig(coordinator="h:1", num_processes=2, process_id=1).multi_process
  # Auto-detection fills in whatever is unset (Cloud TPU, SLURM).
  distributed.DistributedConfig(auto_detect=True)
  distributed.DistributedConfig(auto_detect=True, coordinator="h:1")


def test_one_process_needs_no_runtime_and_the_collectives_are_local():
  distributed.initialize(distributed.DistributedConfig())
  assert not jax.distributed.is_initialized()
  assert distributed.process_count() == 1 and distributed.process_index() == 0 and distributed.is_primary()
  assert distributed.allgather_json({"rows": (1, 2)}) == [{"rows": [1, 2]}]
  assert distributed.max_over_processes(7) == 7
  distributed.sync("nothing to wait for")
  x = jax.device_put(np.arange(8.0), sharding.batch_sharding(sharding.make_mesh(sharding.MeshConfig(data=8)), 1))
  np.testing.assert_array_equal(distributed.gather(x), np.arange(8.0))


def _run_workers(out: pathlib.Path) -> list[dict]:
  port = free_port()
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={worker.DEVICES_PER_PROCESS}",
             JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  procs = []
  for i in range(worker.PROCESSES):
    log = open(out / f"worker_{i}.log", "w")
    procs.append((subprocess.Popen([sys.executable, "-m", "tests.distributed_worker", str(i), str(port), str(out)],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT), log))
  deadline = time.monotonic() + 600
  try:
    # Until all exit, one fails (the other would wait for it in a collective), or the deadline.
    while time.monotonic() < deadline and any(p.poll() is None for p, _ in procs) \
        and not any(p.poll() for p, _ in procs):
      time.sleep(0.5)
  finally:
    for p, log in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
      log.close()
  codes = [p.returncode for p, _ in procs]
  lines = lambda i: [l for l in (out / f"worker_{i}.log").read_text().splitlines() if not l.startswith("[Gloo]")]
  tails = "\n".join(f"--- worker {i}:\n" + "\n".join(lines(i)[-30:]) for i in range(len(procs)))
  assert codes == [0] * len(procs), tails
  return [json.loads((out / f"result_{i}.json").read_text()) for i in range(len(procs))]


def _global_batch(parts, rows: int, length: int, micro_batches: int):
  """The one-process batch whose rows are those of the processes' global array: micro-batch m is every
  process's m-th slice of `rows` rows, in process order (a process's missing rows are empty)."""
  per_micro = rows // micro_batches
  return stack_rows([(part, r) if part is not None and r < part.shape[0] else None
                     for m in range(micro_batches) for part in parts
                     for r in range(m * per_micro, (m + 1) * per_micro)], length)


@pytest.mark.slow  # ~1 min on 2 busy cores: two processes compile and run the step, this one the reference
def test_two_processes_equal_one_process(tmp_path):
  results = _run_workers(tmp_path)
  r0, r1 = results
  assert [r["process_index"] for r in results] == [0, 1]
  assert all(r["process_count"] == 2 and r["devices"] == 8 for r in results)
  assert [r["primary"] for r in results] == [True, False]
  assert r0["allgather"] == r1["allgather"] == [{"id": 0, "rows": [1, 1]}, {"id": 1, "rows": [1, 1, 1]}]
  assert r0["max"] == r1["max"] == 13
  # dcn_data=2 over processes: each data index lives on one process.
  assert r0["hybrid_data_processes"] == [[0], [1]]
  assert "processes [0, 1]" in r0["replicated_rows_error"]

  # Equalised by hand: step 1 is process 0's 6 rows (-> 8: 2 micro-batches x 2 local row shards) and
  # process 1's 2 rows of 64 tokens (-> 8 rows of 96); step 2 is process 0's next 6 rows and 8 empty ones
  # from process 1, which had one batch. Global: [micro-batches, rows, T], then K.
  cfg = worker.learner_config()
  parts = [worker.process_batches(0), worker.process_batches(1)]
  k = r0["prepared"][0][3]
  assert r0["prepared"] == r1["prepared"] == [[2, 8, 96, k]] * 2
  global_batches = [_global_batch([parts[0][0], parts[1][0]], rows=8, length=96, micro_batches=2),
                    _global_batch([parts[0][1], None], rows=8, length=96, micro_batches=2)]

  mesh = sharding.make_mesh(worker.mesh_config())
  assert len(mesh.devices.flat) == 8
  reference = Learner(cfg, make_policy(0), value=make_value_model("shared", TINY.d_model), mesh=mesh)
  expected = [reference.step(b) for b in global_batches]
  for got in (r0["steps"], r1["steps"]):
    for step, (g, e) in enumerate(zip(got, expected)):
      for name in ("loss", "grad_norm", "value_grad_norm", "value_loss", "kl"):
        if name in e:
          assert g[name] == pytest.approx(e[name], rel=TOL), (step, name)
      assert g["tokens"] == e["tokens"] and g["updates"] == e["updates"] == 1

  # The checkpoint written by both processes restored in both to a bitwise-identical next step.
  assert all("cursor of processes [1] differs" in r["cursor_error"] for r in results)
  assert r0["saved_step"] == 1 and r0["cursor"] == r1["cursor"] == {"step": 1}
  assert all(r["resumed_loss_equal"] and r["resumed_state_bitwise"] for r in results)

  # Updated policy params (gathered by process 0) against the reference learner's.
  gathered = np.load(tmp_path / "policy.npz")
  ref_flat = {".".join(map(str, path)): np.asarray(var[...])
              for path, var in nnx.to_flat_state(nnx.state(reference.policy_model(), nnx.Param))}
  assert sorted(gathered.files) == sorted(ref_flat)
  assert rel_diff([gathered[n] for n in sorted(ref_flat)], [ref_flat[n] for n in sorted(ref_flat)]) < TOL

  # The 2-process exports equal, tensor by tensor, the 1-process exports of the same params (the policy's
  # as process 0 gathered them; an MoE model's, experts written one by one).
  policy = make_policy(0)
  for path, var in nnx.to_flat_state(nnx.state(policy, nnx.Param)):
    var[...] = gathered[".".join(map(str, path))]
  one = hf_io.save(policy, tmp_path / "export_one")
  _assert_same_tensors(tmp_path / "export", one)
  assert (tmp_path / "export" / "config.json").read_text() == (one / "config.json").read_text()
  loaded = hf_io.load(tmp_path / "export", dtype=TINY.dtype, param_dtype=TINY.param_dtype)
  assert rel_diff(nnx.state(loaded, nnx.Param), nnx.state(policy, nnx.Param)) == 0.0
  _assert_same_tensors(tmp_path / "export_moe", tmp_path / "export_moe_one")


def _assert_same_tensors(two: pathlib.Path, one: pathlib.Path) -> None:
  """`two` (a 2-process export: one file per process plus the index) holds `one`'s tensors bit for bit."""
  weight_map = json.loads((two / hf_io.INDEX_FILE).read_text())["weight_map"]
  assert sorted(set(weight_map.values())) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
  with safe_open(one / "model.safetensors", framework="np") as ref:
    assert sorted(weight_map) == sorted(ref.keys())
    for name, file in weight_map.items():
      with safe_open(two / file, framework="np") as f:
        got = f.get_tensor(name)
      want = ref.get_tensor(name)
      assert got.dtype == want.dtype and np.array_equal(got, want), name
