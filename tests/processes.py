"""One experiments/ command as several processes of this machine, the hosts of a multi-process run (JAX's
multi-controller runtime on CPU with gloo collectives, `devices` simulated devices each), with the
`--config.distributed.*` flags of docs/cluster.md."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence

from tests.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]


def start(argv: Sequence[str], logs: pathlib.Path, tag: str, *, processes: int = 2,
          devices: int = 2) -> list[subprocess.Popen]:
  """`python ARGV --config.distributed.*` once per process, from the repository root; process i's output
  goes to logs/TAG.process_i.log."""
  port = free_port()
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
  procs = []
  for i in range(processes):
    with open(logs / f"{tag}.process_{i}.log", "w") as log:
      procs.append(subprocess.Popen(
          [sys.executable, *argv, f"--config.distributed.num_processes={processes}",
           f"--config.distributed.process_id={i}", f"--config.distributed.coordinator=127.0.0.1:{port}"],
          cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
  return procs


def wait(procs: Sequence[subprocess.Popen], logs: pathlib.Path, tag: str, timeout_s: float = 600) -> None:
  """Waits for every process to exit 0. Once one fails the others are killed (they would wait for it in a
  collective); the failure names each process's log tail."""
  deadline = time.monotonic() + timeout_s
  try:
    while any(p.poll() is None for p in procs) and not any(p.poll() for p in procs) and time.monotonic() < deadline:
      time.sleep(0.2)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  codes = [p.returncode for p in procs]
  tail = lambda i: "\n".join(l for l in (logs / f"{tag}.process_{i}.log").read_text().splitlines()
                             if not l.startswith("[Gloo]"))[-3000:]
  assert codes == [0] * len(procs), "\n".join(f"--- process {i} (exit {c}):\n{tail(i)}" for i, c in enumerate(codes))


def run(argv: Sequence[str], logs: pathlib.Path, tag: str, **kw) -> None:
  """`start` then `wait`."""
  wait(start(argv, logs, tag, **kw), logs, tag)
