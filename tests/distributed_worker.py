"""One process of the 2-process learner run that tests/test_distributed.py starts (and its shared data).

`python -m tests.distributed_worker PROCESS_ID PORT OUT_DIR`, with 4 CPU devices per process: joins the
other process through `clawjax.distributed`, trains two learner steps on its own rows only, checkpoints
and resumes, exports the policy (and an MoE model) with `hf_io.save`, and writes what it saw to OUT_DIR/result_<id>.json
(process 0 also writes the gathered policy params to OUT_DIR/policy.npz).
"""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np

from clawjax import distributed

PROCESSES = 2
DEVICES_PER_PROCESS = 4


def learner_config():
  from clawjax.rl.config import LearnerConfig, ValueConfig
  # KL (reference params), a shared critic and Adam moments put every part of the train state in the
  # checkpoint; a large Adam epsilon keeps the first update continuous in the gradient (near-zero
  # gradient entries would otherwise step by +-lr on float32 summation noise).
  return LearnerConfig(loss="ppo", optimizer="adamw", lr=1e-3, adam_eps=1e-2, kl_coef=0.1, logits_chunk=32,
                       micro_batches=2, value=ValueConfig(kind="shared"))


def mesh_config():
  from clawjax.sharding import MeshConfig
  return MeshConfig(data=2, fsdp=2, tensor=2)


def process_batches(process_id: int):
  """Each process's own batches: process 0 has two (6 rows of 96 each), process 1 one (2 rows of 64), so
  rows, row length, loss slots and the batch count all need equalising (into one shape: one compile)."""
  from tests.rl.learner_batches import TINY, random_tree, tree_layout
  rng = np.random.default_rng(100 + process_id)
  trees = lambda n, size: [random_tree(rng, size, TINY.vocab_size) for _ in range(n)]
  if process_id == 0:
    return [tree_layout(trees(6, 40), rows=6, length=96), tree_layout(trees(5, 40), rows=6, length=96)]
  return [tree_layout(trees(3, 20), rows=2, length=64)]


def _local_shards(tree) -> list[np.ndarray]:
  import jax
  return [np.asarray(s.data) for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards]


def main(process_id: int, port: int, out: pathlib.Path) -> None:
  distributed.initialize(distributed.DistributedConfig(coordinator=f"127.0.0.1:{port}", num_processes=PROCESSES,
                                                       process_id=process_id))
  distributed.initialize(distributed.DistributedConfig(coordinator=f"127.0.0.1:{port}", num_processes=PROCESSES,
                                                       process_id=process_id))  # idempotent
  import jax
  from flax import nnx

  from clawjax import sharding
  from clawjax.models import hf_io
  from clawjax.models.config import PRESETS
  from clawjax.models.model import Decoder
  from clawjax.rl.checkpoint import Checkpointer
  from clawjax.rl.learner import Learner
  from clawjax.rl.value import make_value_model
  from tests.rl.learner_batches import TINY, make_policy

  result: dict = {"process_index": distributed.process_index(), "process_count": distributed.process_count(),
                  "devices": jax.device_count(), "primary": distributed.is_primary()}
  result["allgather"] = distributed.allgather_json({"id": process_id, "rows": [1] * (process_id + 2)})
  result["max"] = distributed.max_over_processes(10 * process_id + 3)

  hybrid = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2, dcn_data=2, dcn_granule="process"))
  result["hybrid_data_processes"] = [sorted({d.process_index for d in hybrid.devices[i].flat}) for i in range(2)]
  try:
    sharding.local_row_shards(sharding.make_mesh(sharding.MeshConfig(data=1, tensor=8)))
  except ValueError as e:
    result["replicated_rows_error"] = str(e)

  mesh = sharding.make_mesh(mesh_config())
  make = lambda seed: Learner(learner_config(), make_policy(seed), value=make_value_model("shared", TINY.d_model),
                              mesh=mesh)
  learner = make(0)
  prepared = learner.prepare_all(process_batches(process_id))
  result["prepared"] = [list(b.tokens.shape) + [b.weight.shape[-1]] for b in prepared]
  result["steps"] = [learner.step(prepared[0])]

  ckpt = Checkpointer(out / "ckpt")
  try:
    ckpt.save(learner.state, cursor={"step": 1, "process": process_id})  # only process 0's would be saved
  except ValueError as e:
    result["cursor_error"] = str(e)
  result["saved_step"] = ckpt.save(learner.state, cursor={"step": 1})
  result["steps"].append(learner.step(prepared[1]))
  expected = _local_shards(learner.state)

  # Resume into the state of a differently initialised learner: everything must come from disk.
  learner.state, cursor = Checkpointer(out / "ckpt").restore(make(123).state)
  result["cursor"] = cursor
  resumed = learner.step(prepared[1])
  result["resumed_loss_equal"] = resumed["loss"] == result["steps"][1]["loss"]
  got = _local_shards(learner.state)
  result["resumed_state_bitwise"] = len(got) == len(expected) and all(np.array_equal(a, b)
                                                                       for a, b in zip(got, expected))

  policy = learner.policy_copy()
  hf_io.save(policy, out / "export")
  # Gathered leaf by leaf (every process takes part); only process 0 keeps them.
  flat = {".".join(map(str, path)): distributed.gather(var[...])
          for path, var in nnx.to_flat_state(nnx.state(policy, nnx.Param))}
  if distributed.is_primary():
    np.savez(out / "policy.npz", **flat)
  # An MoE model (experts exported one by one) laid out on the mesh, and process 0's local copy.
  moe = Decoder(PRESETS["test-tiny-moe"].replace(tie_embeddings=False), rngs=nnx.Rngs(5))
  graphdef, params, rest = nnx.split(moe, nnx.Param, ...)
  spread = nnx.merge(graphdef, jax.device_put(params, sharding.state_shardings(params, mesh)), rest)
  hf_io.save(spread, out / "export_moe")
  if distributed.is_primary():
    hf_io.save(moe, out / "export_moe_one")
  distributed.sync("worker done")
  (out / f"result_{process_id}.json").write_text(json.dumps(result))


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]))
