"""One process of a two-process asynchronous run on a simulated clock (tests/train/async_sim.py), one
group a step: `python -m tests.train.async_two_processes WORKDIR --config.distributed.*` (as
tests/processes.py starts it). Writes WORKDIR/trained.process_<i>.json: [step, [groups trained]] per step."""
from __future__ import annotations

import json
import pathlib
import sys

from clawjax import distributed
from tests.train import async_sim as sim


def main(argv: list[str]) -> None:
  workdir = pathlib.Path(argv[0])
  flags = dict(a.removeprefix("--config.distributed.").split("=", 1) for a in argv[1:])
  distributed.initialize(distributed.DistributedConfig(coordinator=flags["coordinator"],
                                                       num_processes=int(flags["num_processes"]),
                                                       process_id=int(flags["process_id"])))
  tasks = [sim.task(f"t{i}") for i in range(3)]
  cfg = sim.config(4, tasks_per_step=1, rollouts=2, max_staleness=1)
  run = sim.run(workdir, cfg, tasks, lambda job, label: 1.0, learner_time=0.5,
                process_index=distributed.process_index(), process_count=distributed.process_count())
  trained = [[t.step, run.groups_by_step[t.step]] for t in run.steps.trained]
  (workdir / f"trained.process_{distributed.process_index()}.json").write_text(json.dumps(trained) + "\n")


if __name__ == "__main__":
  main(sys.argv[1:])
