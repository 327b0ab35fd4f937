"""Which devices the engine runs on, and which a learner in the same process keeps.

An engine asked for devices of its own (EngineConfig.devices = n > 0) takes the last n devices of its
process; a learner beside it trains on every other device (of every process), so that new weights move
from the learner's devices to the engine's by `jax.device_put`, without a disk. With n = 0 the engine
runs on its process's first device, which a learner shares.
"""

from __future__ import annotations

import jax


def engine_devices(count: int) -> list[jax.Device]:
  """The devices of an engine that asks for `count` of its own (0: the first local device)."""
  local = jax.local_devices()
  if count > len(local):
    raise ValueError(f"EngineConfig.devices={count}: this process has {len(local)} devices")
  return local[-count:] if count else local[:1]


def learner_devices(engine_count: int) -> list[jax.Device]:
  """Every device of the run (in `jax.devices()` order) but those of the engines that ask for
  `engine_count` of their own: the last `engine_count` of each process's."""
  if not engine_count:
    return jax.devices()
  by_process: dict[int, list[jax.Device]] = {}
  for d in jax.devices():
    by_process.setdefault(d.process_index, []).append(d)
  if engine_count >= min(len(devices) for devices in by_process.values()):
    raise ValueError(f"EngineConfig.devices={engine_count}: a process has {min(map(len, by_process.values()))} "
                     "devices, and the learner needs at least one of each process's beside the engine")
  engines = {d for devices in by_process.values() for d in devices[-engine_count:]}
  return [d for d in jax.devices() if d not in engines]
