"""Several JAX processes as one learner (JAX's multi-controller runtime): start-up and host collectives.

One process per host runs the same command; `initialize` joins them through `jax.distributed` (process
0 serves as coordinator), after which `jax.devices()` lists every process's devices and a Mesh over them
spans the hosts. Call it before anything else touches JAX (a device query, an array, a jit): the
backends are created once, and only then learn about the other processes.

The helpers below are what process-aware code needs besides the mesh: which process this is, and
collectives over host (Python / numpy) values, e.g. the rows each process prepared or its metrics. They
are JAX's own `multihost_utils` collectives (through the devices), so they need no other transport, and
every process must call each of them, in the same order. With one process they cost nothing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from clawjax.config import ConfigError, Positive

CPU_COLLECTIVES = ("gloo", "mpi")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How this process joins the others (all None: a single process).

  Set `coordinator`, `num_processes` and `process_id` explicitly (the same coordinator and count on every
  host, each its own id), or `auto_detect` where the platform tells JAX (Cloud TPU, SLURM, Open MPI).
  """
  coordinator: str | None = None      # "host:port" of process 0's coordinator service, reachable by all
  num_processes: int | None = None    # processes in the run (one per host); None or 1: one process
  process_id: int | None = None       # this process's index in 0..num_processes-1
  auto_detect: bool = False           # let JAX find the unset fields above from the cluster environment
  # Cross-process collectives of the CPU backend (CPU-only runs, e.g. the local 2-process simulation).
  cpu_collectives: str = "gloo"
  initialization_timeout_s: Positive[int] = 300  # how long a process waits for the others to join
  # How long a process that finished its share of the work (an evaluation's rollouts) waits for the others.
  finish_timeout_s: Positive[int] = 24 * 3600

  def __post_init__(self):
    where = "config.distributed"
    if self.coordinator is not None:
      host, _, port = self.coordinator.rpartition(":")
      if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{where}.coordinator: {self.coordinator!r} is not host:port")
    if self.num_processes is not None and self.num_processes < 1:
      raise ConfigError(f"{where}.num_processes: {self.num_processes} must be >= 1")
    if self.cpu_collectives not in CPU_COLLECTIVES:
      raise ConfigError(f"{where}.cpu_collectives: {self.cpu_collectives!r} is not one of {CPU_COLLECTIVES}")
    for name in ("initialization_timeout_s", "finish_timeout_s"):
      if getattr(self, name) < 1:
        raise ConfigError(f"{where}.{name}: {getattr(self, name)} must be >= 1")
    if self.auto_detect:
      return  # JAX fills in whichever of the three fields is unset
    if self.multi_process and self.coordinator is None:
      raise ConfigError(f"{where}.num_processes: {self.num_processes} processes need "
                        f"{where}.coordinator (host:port of process 0), or {where}.auto_detect")
    if self.coordinator is not None and not self.multi_process:
      raise ConfigError(f"{where}.coordinator: set, but {where}.num_processes is {self.num_processes} "
                        "(set it to the number of processes, > 1)")
    if self.multi_process and self.process_id is None:
      raise ConfigError(f"{where}.process_id: required with num_processes={self.num_processes}")
    if self.process_id is not None and not 0 <= self.process_id < (self.num_processes or 1):
      raise ConfigError(f"{where}.process_id: {self.process_id} is not in 0..{(self.num_processes or 1) - 1} "
                        f"(num_processes={self.num_processes})")

  @property
  def multi_process(self) -> bool:
    return self.num_processes is not None and self.num_processes > 1


def initialize(cfg: DistributedConfig) -> None:
  """Joins the run's processes (`jax.distributed.initialize`) when `cfg` asks for several or for
  auto-detection; otherwise does nothing. Idempotent: a second call is a no-op."""
  if jax.distributed.is_initialized() or not (cfg.multi_process or cfg.auto_detect):
    return
  # Read only by the CPU client, which is created after this (GPU / TPU backends ignore it).
  jax.config.update("jax_cpu_collectives_implementation", cfg.cpu_collectives)
  jax.distributed.initialize(coordinator_address=cfg.coordinator, num_processes=cfg.num_processes,
                             process_id=cfg.process_id, initialization_timeout=cfg.initialization_timeout_s)


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """Whether this process writes what is written once (metrics, summaries, config.json, indices)."""
  return jax.process_index() == 0


def allgather_json(obj: Any) -> list[Any]:
  """`obj` (anything JSON can hold) of every process, in process order. Values come back as JSON decodes
  them (tuples as lists, dict keys as strings) whatever the process count."""
  data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
  if jax.process_count() == 1:
    return [json.loads(data.tobytes())]
  lengths = multihost_utils.process_allgather(np.int32(len(data)))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:len(data)] = data
  gathered = multihost_utils.process_allgather(padded)
  return [json.loads(row[:n].tobytes()) for row, n in zip(gathered, lengths)]


def max_over_processes(value: int) -> int:
  """The largest `value` any process passed."""
  if not -2**31 <= value < 2**31:
    raise ValueError(f"max_over_processes: {value} does not fit int32")
  if jax.process_count() == 1:
    return int(value)
  return int(multihost_utils.process_allgather(np.int32(value)).max())


def sync(name: str) -> None:
  """A barrier: returns once every process has reached `sync(name)` (the same name on all)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def wait_for_all(name: str, timeout_s: int) -> None:
  """A barrier for waits longer than a collective may block: the coordination service's (through
  orbax.checkpoint.multihost), which gives up with an error after `timeout_s`."""
  if jax.process_count() > 1:
    from orbax.checkpoint import multihost  # pylint: disable=import-outside-toplevel  (only several processes)
    multihost.get_barrier_sync_fn()(key=name, timeout_ms=timeout_s * 1000)


def process_file(name: str, index: int, count: int) -> str:
  """`name` for process `index`'s file beside the other processes' (rollouts.jsonl ->
  rollouts.process_1.jsonl), so that no two processes append to one file; `name` itself for one process."""
  return name if count == 1 else _tagged(name, f"process_{index}")


def process_files_pattern(name: str) -> str:
  """The glob pattern of every process's `process_file(name, ...)` in a multi-process run."""
  return _tagged(name, "process_*")


def _tagged(name: str, tag: str) -> str:
  stem, dot, suffix = name.partition(".")
  return f"{stem}.{tag}{dot}{suffix}"


def gather(x: jax.Array) -> np.ndarray:
  """The whole of array `x` on this host. An array spread over several processes is all-gathered: every
  process must call this for it (each gets the whole array), so gather big trees one array at a time."""
  if x.is_fully_addressable:
    return np.asarray(jax.device_get(x))
  return multihost_utils.process_allgather(x, tiled=True)
