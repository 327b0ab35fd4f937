r"""Synchronous against asynchronous RL, side by side in one run, as on a cluster: the policy is served by
a separate engine server process and the trainer (with its learner) runs in another, each pinned to its
own core(s).

  python benchmarks/async_loop.py --json [--steps 20] [--straggler-steps 5] [--workdir DIR]

The loop is the quickstart's (configs/quickstart.py: its toy policy, the mini harness, its four tasks,
its cold start), with the engine in `python -m clawjax.engine` (started from the quickstart's initial
weights, exported; the trainer pushes every update to it over its weight-update endpoint) instead of in
the trainer's process; the async runs let one step of rollouts run ahead (`batch.max_staleness=1`; the
quickstart's own is 0, strictly on-policy). Four runs: sync and async for `--steps` steps (reward gain),
then sync and async for `--straggler-steps` steps with one straggling rollout per step (its harness starts late by
`--straggler-factor` times the median rollout time of the first sync run). Each run is a fresh trainer
process (and engine server), so none inherits the learner steps another run compiled.

The shim runs as two worker processes (`shim.workers=2`). Where the rollout side runs (`--rollout-cores`,
i.e. `rollout.cores`: the shim's processes, the threads that drive rollouts, the harnesses and checkers):
on the engine's cores (default), as on a cluster where rollouts run on other hosts than the learner; or on
the trainer's, where an async run's next rollouts take CPU from the learner's step.

Prints one JSON object: {"sync": {"step_s", "rollout_s", "learner_s", "reward_gain",
"dropped_stale_groups"}, "async": {..., "staleness_hist", "tis_truncated"}, "straggler": {"sync_growth",
"async_growth"}} — seconds are medians per step over steps 2.. (step 1 compiles); `reward_gain` is the mean
reward of the last 5 steps minus the first 5; `dropped_stale_groups` is the fraction of the groups a run's
steps took that were dropped as too stale (0 for sync, which drops none); `*_growth` is the relative
increase of the median step time with the straggler.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import pathlib
import sys
import tempfile

import numpy as np

from clawjax.server_process import free_port, running

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN = "benchmark-admin-token"


@dataclasses.dataclass(frozen=True)
class Cores:
  """The machine split in two: the engine server's cores and the trainer's (its learner's); the rollout
  side (`rollout.cores`) runs on one of them."""
  engine: frozenset[int]
  trainer: frozenset[int]
  rollout: frozenset[int]

  @classmethod
  def split(cls, rollout_side: str) -> "Cores":
    """Taken before the trainer pins itself: afterwards this process sees only the trainer's cores."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    engine, trainer = frozenset(cores[:half]), frozenset(cores[half:] or cores[:half])
    return cls(engine, trainer, engine if rollout_side == "engine" else trainer)

  def to_json(self) -> dict[str, list[int]]:
    return {k: sorted(v) for k, v in dataclasses.asdict(self).items()}


@contextlib.contextmanager
def _engine(model_dir: str, port: int, cores: frozenset[int]):
  with running([sys.executable, "-m", "clawjax.engine", "--model", model_dir, "--port", str(port), "--max-slots",
                "8", "--max-seq-len", "1024"], f"http://127.0.0.1:{port}/health", env={"CLAWJAX_ADMIN_TOKEN": TOKEN},
               timeout_s=300, cores=cores):
    yield f"http://127.0.0.1:{port}"


def _config(steps: int, url: str, export: str, async_rl: bool, harness: str, overrides: tuple[str, ...] = ()):
  import importlib.util  # pylint: disable=import-outside-toplevel
  from clawjax.train.config import train_config  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("quickstart_config", ROOT / "configs" / "quickstart.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return train_config(module.get_config(), [f"steps={steps}", f"async_rl={async_rl}", "engine.backend=sglang",
                             f"engine.url={url}", f"engine.export_dir={export}", "engine.options={}",
                             f"harnesses={harness}", "progress=false", "plot=false", "tensorboard=false",
                             "checkpoint_every=1000", f"batch.max_staleness={int(async_rl)}", *overrides])


def _train_one(name: str, steps: int, delay: float, cores: Cores, url: str, model_dir: str,
               work: pathlib.Path) -> None:
  """One run, in a process of its own pinned to the trainer's cores (JAX after the affinity is set)."""
  os.sched_setaffinity(0, cores.trainer)
  # pylint: disable=import-outside-toplevel
  from clawjax.harness import adapters
  from clawjax.train.trainer import train

  class BenchMini(adapters.Mini):
    """The mini harness; with a delay, rollout 0 of task qs_sky (in every step's sample: the quickstart
    takes all four tasks) starts late, so that it takes `--straggler-factor` times the median rollout."""
    name = "bench_mini"

    def command(self, base_url, api_key, prompt, home, options):
      cmd = super().command(base_url, api_key, prompt, home, options)
      rollout = base_url.rstrip("/").rsplit("/r/", 1)[-1]
      late = delay if "-qs_sky-" in rollout and rollout.rsplit("-", 2)[-2] == "0" else 0.0
      return dataclasses.replace(cmd, argv=["/bin/sh", "-c", f'sleep {late:.1f}; exec "$@"', "sh", *cmd.argv])

  adapters.ADAPTERS[BenchMini.name] = BenchMini()
  train(_config(steps, url, str(work / f"{name}-export"), name.startswith("async"), BenchMini.name,
                (f"model.init={model_dir}", "model.random_init=false", "model.overrides={}", "sft.steps=0",
                 "shim.workers=2", f"rollout.cores={','.join(map(str, sorted(cores.rollout)))}")), work / name)


def _run(name: str, steps: int, delay: float, cores: Cores, model_dir: str, work: pathlib.Path) -> dict:
  from clawjax.train.metrics import read_metrics  # pylint: disable=import-outside-toplevel
  with _engine(model_dir, free_port(), cores.engine) as url:
    proc = multiprocessing.get_context("spawn").Process(
        target=_train_one, args=(name, steps, delay, cores, url, model_dir, work), name=f"trainer-{name}")
    proc.start()
    proc.join()
    if proc.exitcode != 0:
      raise RuntimeError(f"the {name} run's trainer process failed (exit status {proc.exitcode})")
  rows = sorted(read_metrics(work / name, "rl"), key=lambda r: r["step"])
  later = rows[1:] or rows
  times = _step_times(rows)
  rewards = [r.get("reward/mean", 0.0) for r in rows]
  out = {"steps": len(rows), "step_s": round(float(np.median(times)), 2) if times else None,
         "rollout_s": round(float(np.median([r["rollout_s"] for r in later])), 2),
         "learner_s": round(float(np.median([r["learner_s"] for r in later])), 2),
         "reward_gain": round(float(np.mean(rewards[-5:]) - np.mean(rewards[:5])), 4),
         "dropped_stale_groups": _dropped_stale_groups(rows)}
  if name.startswith("async"):
    hist: dict[str, float] = {}
    for r in rows:
      for k, v in r.items():
        if k.startswith("staleness/"):
          hist[k.split("/")[1]] = hist.get(k.split("/")[1], 0.0) + v
    out["staleness_hist"] = hist
    out["tis_truncated"] = round(float(np.mean([r.get("tis_truncated_fraction", 0.0) for r in rows])), 4)
  return out


def _dropped_stale_groups(rows: list[dict]) -> float:
  """The fraction of the groups taken by a run's steps that were dropped as stale (an async run's
  `groups/*` metrics; a sync run has none and drops no group)."""
  taken = sum(r.get("groups/taken", 0.0) for r in rows)
  return round(sum(r.get("groups/dropped_stale", 0.0) for r in rows) / taken, 4) if taken else 0.0


def _cold_start(work: pathlib.Path) -> str:
  """The quickstart's cold start, once for every run: its policy after SFT, as an HF directory that the
  engine server starts from and every run's model.init names."""
  # pylint: disable=import-outside-toplevel
  from clawjax.models import hf_io
  from clawjax.models.loading import load_model
  from clawjax.tasks import select_tasks
  from clawjax.train.cold_start import record_demos, run_sft
  from clawjax.train.metrics import MetricsWriter
  cfg = _config(1, "http://unused", "", False, "mini")
  out = work / "cold_start"
  out.mkdir(parents=True, exist_ok=True)
  policy = load_model(cfg.model.init, seed=cfg.seed, random_init=True, **cfg.model.overrides).model
  trees = record_demos(cfg, select_tasks(cfg.tasks), out)
  policy = run_sft(policy, trees, cfg.sft, cfg.learner, MetricsWriter(out, tensorboard=False), cfg.seed)
  hf_io.save(policy, out / "model")
  return str(out / "model")


def _step_times(rows: list[dict]) -> list[float]:
  """Seconds between consecutive steps' metrics (steps 2..: step 1 includes start-up and compiles)."""
  return [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]


def _median_rollout_s(run: pathlib.Path) -> float:
  from clawjax.calllog import RolloutRecord, iter_records  # pylint: disable=import-outside-toplevel
  walls = [r.extra["wall_s"] for f in run.glob("steps/step_*/rollouts.jsonl") for r in iter_records(f)
           if isinstance(r, RolloutRecord) and "wall_s" in r.extra]
  return float(np.median(walls))


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--straggler-steps", type=int, default=5)
  parser.add_argument("--straggler-factor", type=float, default=5.0)
  parser.add_argument("--rollout-cores", choices=("engine", "trainer"), default="engine",
                      help="where the rollout side runs (see above)")
  parser.add_argument("--workdir", default=None, help="keep the runs here (default: a temporary dir)")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args(argv)
  cores = Cores.split(args.rollout_cores)
  os.sched_setaffinity(0, cores.trainer)
  os.environ["CLAWJAX_ADMIN_TOKEN"] = TOKEN
  # pylint: disable=import-outside-toplevel  (JAX after the affinity is set)
  from clawjax.environment import describe as describe_environment
  from clawjax.train.metrics import read_metrics
  with tempfile.TemporaryDirectory() as tmp:
    work = pathlib.Path(args.workdir or tmp)
    model_dir = _cold_start(work)
    report: dict = {m: _run(m, args.steps, 0.0, cores, model_dir, work) for m in ("sync", "async")}
    delay = args.straggler_factor * _median_rollout_s(work / "sync")
    late = {m: _run(f"{m}-straggler", args.straggler_steps, delay, cores, model_dir, work) for m in ("sync", "async")}
    # Against the same modes' first steps without the straggler (the runs above).
    base = {m: float(np.median(_step_times(sorted(read_metrics(work / m, "rl"), key=lambda r: r["step"])
                                           [:args.straggler_steps]))) for m in late}
    report["straggler"] = {f"{m}_growth": round(late[m]["step_s"] / base[m] - 1, 3) for m in late}
    report["straggler"]["delay_s"] = round(delay, 2)
  report["cores"] = cores.to_json()
  report["environment"] = describe_environment()
  print(json.dumps(report, indent=None if args.json else 2))
  return report


if __name__ == "__main__":
  main()
