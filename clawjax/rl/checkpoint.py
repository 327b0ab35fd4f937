"""Orbax checkpoints of the learner: params, optimizer state, step, RNG and the caller's data cursor.

The train state is saved as a flat {path: array} dict (robust to NNX / optax container types) next to the
cursor, an opaque JSON dict from the caller (e.g. which call-log batches were consumed). Restoring into a
live `TrainState` reuses its tree structure and shardings, so a resumed run continues bit for bit.

In a run of several processes every process makes the Checkpointer and calls `save` and `restore` at the
same points (Orbax's CheckpointManager is a collective): each writes and reads the shards of its own
devices, process 0 (Orbax's primary host) the metadata and the cursor, so the directory must be on a
filesystem that every process sees, and the cursor must be the same on every process.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

from clawjax import distributed
from clawjax.rl.learner import TrainState
from clawjax.sharding import flat_name


def _flat(state: TrainState) -> tuple[dict[str, Any], Any]:
  leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
  return {flat_name(path): leaf for path, leaf in leaves}, treedef


class Checkpointer:
  """A CheckpointManager over `directory` keeping the newest `max_to_keep` steps."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3):
    # Synchronous saves: the learner saves between steps, and a returned save is on disk.
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(os.path.abspath(directory), options=options)
    # Process 0 created the directory; a process that does not see it writes its shards elsewhere.
    seen = distributed.allgather_json(os.path.isdir(self.manager.directory))
    if not all(seen):
      raise ValueError(f"checkpoint directory {self.manager.directory}: processes "
                       f"{[i for i, ok in enumerate(seen) if not ok]} do not see it (process 0 created it); "
                       "every process must write to a filesystem they all share")

  def save(self, state: TrainState, cursor: dict[str, Any] | None = None) -> int:
    """Saves under the state's step number; returns that step."""
    step = int(jax.device_get(state.step))
    cursors = distributed.allgather_json(cursor or {})
    if any(c != cursors[0] for c in cursors):
      differ = [i for i, c in enumerate(cursors) if c != cursors[0]]
      raise ValueError(f"checkpoint {step}: the cursor of processes {differ} differs from process 0's "
                       f"({cursors[differ[0]]} vs {cursors[0]}); only process 0's would be saved")
    flat, _ = _flat(state)
    self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(flat),
                                                    cursor=ocp.args.JsonSave(cursor or {})))
    return step

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def restore(self, like: TrainState, step: int | None = None) -> tuple[TrainState, dict[str, Any]]:
    """(state, cursor) of `step` (default: latest), laid out like the live state `like`."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.manager.directory}")
    flat, treedef = _flat(like)
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in flat.items()}
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                             cursor=ocp.args.JsonRestore()))
    missing = set(abstract) - set(out["state"])
    if missing:
      raise ValueError(f"checkpoint step {step} in {self.manager.directory} lacks {sorted(missing)[:3]}")
    leaves = [out["state"][k] for k in flat]
    return jax.tree_util.tree_unflatten(treedef, leaves), dict(out["cursor"])

  def close(self) -> None:
    self.manager.close()
