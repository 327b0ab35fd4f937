"""Evaluation run directories, and Table 1 assembled from them next to the paper's numbers.

A run directory (`experiments/eval.py --workdir`) holds `run.json` (what was evaluated: benchmark,
harness, model label, tasks), `results.jsonl` (results.py), `rollouts.jsonl` (the rollout records),
`calls/` (the shim's call logs) and, after each run, `summary.md` / `summary.json`.

Table layout (the paper's Table 1, widened): one row per (harness, model); per benchmark its score, the
paper's score next to it (PinchBench and ClawGym-Bench), and the number of tasks that count; then one
column per (benchmark, category). Runs of the same (harness, model, benchmark) are merged (e.g. a
benchmark split over machines); the same task in two of them is an error. Where the runs recorded
their environment (environment.json, clawjax/environment.py), each row also names the clawjax commit
it ran (`+dirty` for uncommitted changes) and its environment, A, B, ... by what it ran on (package
versions, harness and engine locks, Python); `environment_legend` says how they differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from clawjax import environment
from clawjax.config import differences
from clawjax.evaluation import paper
from clawjax.evaluation.results import STATUSES, ResultsError, TaskResult, latest, load_results
from clawjax.evaluation.summary import UNSCORED_CHOICES, BenchmarkScore, summarize
from clawjax.evaluation.table import Cell, Table

RUN_FILE, RESULTS_FILE, ROLLOUTS_FILE = "run.json", "results.jsonl", "rollouts.jsonl"
SUMMARY_MD, SUMMARY_JSON, CALLS_DIR = "summary.md", "summary.json", "calls"


@dataclasses.dataclass(frozen=True)
class RunInfo:
  """What a run directory evaluates; a resumed run must agree on every field."""
  benchmark: str
  harness: str
  model_label: str
  tasks: str
  unscored: str = "zero"

  @classmethod
  def from_json(cls, obj: Any, where: str) -> "RunInfo":
    if not isinstance(obj, dict):
      raise ResultsError(f"{where}: expected a JSON object")
    kwargs = {}
    for f in dataclasses.fields(cls):
      if f.name not in obj:
        if f.default is dataclasses.MISSING:
          raise ResultsError(f"{where}: field {f.name!r}: missing")
        continue
      if not isinstance(obj[f.name], str):
        raise ResultsError(f"{where}: field {f.name!r}: expected a string")
      kwargs[f.name] = obj[f.name]
    if kwargs.get("unscored", "zero") not in UNSCORED_CHOICES:
      raise ResultsError(f"{where}: field 'unscored': not one of {UNSCORED_CHOICES}")
    return cls(**kwargs)

  @property
  def row(self) -> tuple[str, str]:
    return paper.harness_display(self.harness), self.model_label


@dataclasses.dataclass
class Run:
  path: str
  info: RunInfo
  results: list[TaskResult]  # the last record of each (task, sample)
  environment: dict[str, Any] | None = None  # environment.json, where the run wrote one


def read_run_info(workdir: str | os.PathLike[str]) -> RunInfo | None:
  path = pathlib.Path(workdir) / RUN_FILE
  if not path.exists():
    return None
  try:
    obj = json.loads(path.read_text(encoding="utf-8"))
  except ValueError as e:
    raise ResultsError(f"{path}: invalid JSON ({e})") from None
  return RunInfo.from_json(obj, str(path))


def load_run(workdir: str | os.PathLike[str]) -> Run:
  info = read_run_info(workdir)
  if info is None:
    raise ResultsError(f"{workdir}: no {RUN_FILE}: not an evaluation run directory")
  results = list(latest(load_results(pathlib.Path(workdir) / RESULTS_FILE)).values())
  env_file = pathlib.Path(workdir) / environment.FILENAME
  try:
    env = json.loads(env_file.read_text(encoding="utf-8")) if env_file.exists() else None
  except ValueError as e:
    raise ResultsError(f"{env_file}: invalid JSON ({e})") from None
  return Run(os.fspath(workdir), info, results, env)


def _fingerprint(env: dict[str, Any]) -> dict[str, Any]:
  """What a score depends on, beyond the code: package versions, harness and engine locks, Python."""
  return {"python": (env.get("python") or {}).get("version"), "packages": env.get("packages"),
          "harnesses": {k: (v or {}).get("lock_sha256") for k, v in (env.get("harnesses") or {}).items()},
          "engines": env.get("engines")}


def _commit(env: dict[str, Any]) -> str:
  ours = env.get("clawjax") or {}
  commit = (ours.get("commit") or "unknown")[:10]
  return commit + ("+dirty" if ours.get("dirty") else "")


def _environments(runs: Sequence[Run]) -> list[str]:
  """The distinct fingerprints of the runs, as canonical JSON, in order of first appearance."""
  out: list[str] = []
  for run in runs:
    if run.environment is not None:
      key = json.dumps(_fingerprint(run.environment), sort_keys=True)
      if key not in out:
        out.append(key)
  return out


def _env_label(index: int) -> str:
  return chr(ord("A") + index) if index < 26 else f"E{index}"


def environment_legend(runs: Sequence[Run]) -> str:
  """One line per environment after the first: what differs from environment A ("" with one or none)."""
  envs = [json.loads(e) for e in _environments(runs)]
  lines = []
  for i, env in enumerate(envs[1:], start=1):
    diff = [f"{k}: {a!r} -> {b!r}" for k, (a, b) in differences(envs[0], env).items()]
    lines.append(f"- environment {_env_label(i)} differs from A in {'; '.join(diff)}")
  return "\n".join(lines) + ("\n" if lines else "")


def _merge(runs: Sequence[Run]) -> dict[tuple[str, str], dict[str, tuple[str, list[TaskResult]]]]:
  """(harness, model) -> benchmark -> (unscored, results), checking that merged runs are disjoint."""
  out: dict[tuple[str, str], dict[str, tuple[str, list[TaskResult]]]] = {}
  seen: dict[tuple[tuple[str, str], str, tuple[str, int]], str] = {}
  for run in runs:
    by_bench = out.setdefault(run.info.row, {})
    unscored, merged = by_bench.setdefault(run.info.benchmark, (run.info.unscored, []))
    if unscored != run.info.unscored:
      raise ResultsError(f"{run.path}: unscored={run.info.unscored!r} differs from another run of "
                         f"{run.info.row} on {run.info.benchmark} ({unscored!r})")
    for r in run.results:
      key = (run.info.row, run.info.benchmark, r.key)
      if key in seen:
        raise ResultsError(f"task {r.task_id!r} (sample {r.sample}) of {run.info.row} on "
                           f"{run.info.benchmark} is in both {seen[key]} and {run.path}")
      seen[key] = run.path
      merged.append(r)
  return out


def scores(runs: Sequence[Run]) -> dict[tuple[str, str], dict[str, BenchmarkScore]]:
  """(harness, model) -> benchmark -> its scores."""
  return {row: {b: summarize(rs, unscored) for b, (unscored, rs) in by_bench.items()}
          for row, by_bench in _merge(runs).items()}


def assemble(runs: Sequence[Run], paper_rows: bool = True) -> Table:
  """Table 1 for `runs`; `paper_rows` also lists the paper's rows (and benchmark columns) that no
  run matches."""
  measured = scores(runs)
  rows = [k for k in paper.TABLE1 if paper_rows or k in measured]
  rows += [k for k in measured if k not in paper.TABLE1]
  run_benchmarks = {b for s in measured.values() for b in s}
  benchmarks = [b for b in paper.BENCHMARKS if paper_rows or b in run_benchmarks]
  benchmarks += sorted(run_benchmarks - set(paper.BENCHMARKS))
  categories = {b: sorted({c for s in measured.values() if b in s for c in s[b].categories})
                for b in benchmarks}
  columns = ["harness", "model"]
  for b in benchmarks:
    columns += [b] + ([f"{b} (paper)"] if b in paper.BENCHMARKS else []) + [f"{b} tasks"]
  columns += [f"{b}: {c}" for b in benchmarks for c in categories[b]]
  envs = _environments(runs)
  if envs:
    columns += ["commit", "environment"]
  table_rows = []
  for key in rows:
    ours, theirs = measured.get(key, {}), paper.TABLE1.get(key, {})
    row: list[Cell] = list(key)
    for b in benchmarks:
      row.append(ours[b].overall.score if b in ours else None)
      if b in paper.BENCHMARKS:
        row.append(theirs.get(b))
      row.append(ours[b].overall.tasks if b in ours else None)
    for b in benchmarks:
      for c in categories[b]:
        group = ours[b].categories.get(c) if b in ours else None
        row.append(group.score if group else None)
    if envs:
      mine = [r.environment for r in runs if r.info.row == key and r.environment is not None]
      row.append(", ".join(sorted({_commit(e) for e in mine})) or None)
      labels = {_env_label(envs.index(json.dumps(_fingerprint(e), sort_keys=True))) for e in mine}
      row.append(", ".join(sorted(labels)) or None)
    table_rows.append(row)
  return Table(columns, table_rows)


def category_table(score: BenchmarkScore) -> Table:
  """Per category: tasks that count, rollouts by status, and the score in percent."""
  columns = ["category", "tasks", "rollouts", *STATUSES, "score"]
  rows = [[g.name, g.tasks, g.rollouts, *(g.statuses[s] for s in STATUSES), g.score]
          for g in [*score.categories.values(), score.overall]]
  return Table(columns, rows)


def write_summary(run: Run, extra: dict[str, Any] | None = None) -> str:
  """Writes summary.md and summary.json (with `extra`, e.g. the isolation rollouts ran under) into the
  run directory; returns the Markdown."""
  score = summarize(run.results, run.info.unscored)
  text = (f"# {run.info.benchmark}: {run.info.row[0]} / {run.info.model_label}\n\n"
          f"{assemble([run], paper_rows=False).markdown()}\n{category_table(score).markdown()}")
  workdir = pathlib.Path(run.path)
  (workdir / SUMMARY_MD).write_text(text, encoding="utf-8")
  (workdir / SUMMARY_JSON).write_text(json.dumps(
      {**dataclasses.asdict(run.info), **score.to_json(), **(extra or {})}, indent=2) + "\n", encoding="utf-8")
  return text
