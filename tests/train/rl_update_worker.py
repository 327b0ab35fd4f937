"""One process of the RL update that tests/train/test_multiprocess.py runs on one and on two processes.

`python -m tests.train.rl_update_worker OUT_DIR [--config.distributed.FIELD=VALUE ...]` (the flags
tests/processes.py adds; without them, one process). Each process builds the step data of its own groups
(group g on process g mod P, as the trainer deals them) with `build_step`, makes the step's updates with
`update` on a data-parallel mesh over every process's devices, and process 0 writes the step's metrics
(metrics.json) and the gathered policy params (params.npz) to OUT_DIR.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import numpy as np

from clawjax import distributed

GROUPS = 4
FLAG = "--config.distributed."


def step_log(process: int, processes: int):
  """The calls and rollout records of this process's groups: two rollouts each, rewards 0 and 1, so that
  every group has advantages of both signs; a group's shared prompt and its rollouts fill one 256-token row."""
  from clawjax.calllog import LoadedLog
  from clawjax.tree.synthetic import agent_group
  from tests.rl.learner_batches import TINY
  calls, rollouts = {}, {}
  for g in range(process, GROUPS, processes):
    group_calls, outcomes = agent_group(np.random.default_rng(g), task_id=f"t{g}", n_rollouts=2, prompt_len=24,
                                        n_calls=2, tokens_per_call=8, vocab_size=TINY.vocab_size, rewards=[0.0, 1.0])
    for c in group_calls:  # sampled by version 0, the learner's (an unversioned call is never trained)
      calls.setdefault(c.rollout_id, []).append(dataclasses.replace(c, policy_version=0))
    rollouts.update({o.rollout_id: o for o in outcomes})
  return LoadedLog(calls=calls, rollouts=rollouts, problems=[])


def run(out: pathlib.Path, mesh_config, devices=None) -> None:
  """The step on this process's groups, on a mesh over `devices` (default: all); process 0 writes the
  results."""
  from flax import nnx

  from clawjax import sharding
  from clawjax.rl.config import LearnerConfig
  from clawjax.rl.learner import Learner
  from clawjax.train.step_data import BatchConfig, build_step
  from clawjax.train.steps import update
  from clawjax.tree.filters import FilterConfig
  from tests.rl.learner_batches import TINY, make_policy

  # Plain SGD: the params follow the gradients linearly, so the runs compare to float32 summation order.
  cfg = LearnerConfig(optimizer="sgd", lr=0.5, grad_clip=None, logits_chunk=64)
  learner = Learner(cfg, make_policy(0), mesh=sharding.make_mesh(mesh_config, devices))
  data = build_step(step_log(distributed.process_index(), distributed.process_count()), policy_version=0,
                    vocab_size=TINY.vocab_size, filters=FilterConfig(), batch=BatchConfig(row_len=256, rows=2))
  metrics = update(learner, data, 0)
  params = {".".join(map(str, path)): distributed.gather(var[...])
            for path, var in nnx.to_flat_state(nnx.state(learner.policy_model(), nnx.Param))}
  if distributed.is_primary():
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "params.npz", **params)
    (out / "metrics.json").write_text(json.dumps(dict(metrics, batches=len(data.batches))))


def main(argv: list[str]) -> None:
  fields = dict(a[len(FLAG):].split("=", 1) for a in argv[1:])
  cfg = distributed.DistributedConfig(coordinator=fields["coordinator"], num_processes=int(fields["num_processes"]),
                                      process_id=int(fields["process_id"]))
  distributed.initialize(cfg)
  from clawjax.sharding import MeshConfig
  run(pathlib.Path(argv[0]), MeshConfig(data=-1))


if __name__ == "__main__":
  main(sys.argv[1:])
