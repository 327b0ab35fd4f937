"""Evaluation run directories, and Table 1 assembled from them next to the paper's numbers.

A run directory (`experiments/eval.py --workdir`) holds `run.json` (what was evaluated: benchmark,
harness, model label, tasks, seed, trained_in), `results.jsonl` (results.py), `rollouts.jsonl` (the rollout records),
`calls/` (the shim's call logs) and, after each run, `summary.md` / `summary.json`.

Table layout (the paper's Table 1, widened): one row per (harness, model); per benchmark its score, the
paper's score next to it (PinchBench and ClawGym-Bench), and the number of tasks that count; then one
column per (benchmark, category). Runs of the same (harness, model, benchmark) and `seed` are merged (e.g. a
benchmark split over machines); the same task in two of them is an error. Runs of other seeds are
repeats: Table 1 shows the mean over seeds, `seeds_table` the mean, a bootstrap interval over seeds and n
(stats.py), per category too, and a paired test per task against a baseline model's row;
`transfer_tables` lays runs out by the harness the policy was trained in (`trained_in`) x the harness it
was evaluated in. Where the runs recorded
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

import numpy as np

from clawjax import environment
from clawjax.config import did_you_mean, differences
from clawjax.evaluation import paper
from clawjax.evaluation.results import STATUSES, ResultsError, TaskResult, latest, load_results
from clawjax.evaluation.stats import StatsConfig, bootstrap_interval, paired_test, task_bootstrap_interval
from clawjax.evaluation.summary import UNSCORED_CHOICES, BenchmarkScore, mean_over_seeds, summarize, task_scores
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
  seed: int = 0  # which repeat of (harness, model, benchmark): runs of other seeds are averaged over
  trained_in: str | None = None  # the harness the policy was trained in, "base" or "cold_start" (EvalConfig)

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
      v = obj[f.name]
      ok = (isinstance(v, int) and not isinstance(v, bool) if f.name == "seed" else
            v is None or isinstance(v, str) if f.name == "trained_in" else isinstance(v, str))
      if not ok:
        raise ResultsError(f"{where}: field {f.name!r}: expected {'an integer' if f.name == 'seed' else 'a string'}")
      kwargs[f.name] = v
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


@dataclasses.dataclass
class Repeats:
  """The runs of one (harness, model) on one benchmark: results per seed (a seed's runs merged)."""
  unscored: str
  by_seed: dict[int, list[TaskResult]]
  trained_in: str | None

  def seed_scores(self) -> dict[int, BenchmarkScore]:
    return {seed: summarize(rs, self.unscored) for seed, rs in sorted(self.by_seed.items())}

  def task_seed_scores(self, category: str | None = None) -> dict[str, list[float]]:
    """Each task's scores in [0, 1], one per seed that scored it (of one category, or all)."""
    per_seed = [task_scores((r for r in rs if category is None or r.category == category), self.unscored)
                for rs in self.by_seed.values()]
    return {t: [s[t] for s in per_seed if t in s] for t in sorted({t for s in per_seed for t in s})}

  def task_scores(self, category: str | None = None) -> dict[str, float]:
    """Each task's score in [0, 1], the mean over seeds that scored it (of one category, or all)."""
    return {t: float(np.mean(v)) for t, v in self.task_seed_scores(category).items()}


def _merge(runs: Sequence[Run]) -> dict[tuple[str, str], dict[str, Repeats]]:
  """(harness, model) -> benchmark -> its runs by seed, checking that the runs merged into one seed are
  disjoint and that repeats agree on `unscored` and `trained_in`."""
  out: dict[tuple[str, str], dict[str, Repeats]] = {}
  seen: dict[tuple[tuple[str, str], str, int, tuple[str, int]], str] = {}
  for run in runs:
    info = run.info
    rep = out.setdefault(info.row, {}).setdefault(info.benchmark, Repeats(info.unscored, {}, info.trained_in))
    for field in ("unscored", "trained_in"):
      if getattr(rep, field) != getattr(info, field):
        raise ResultsError(f"{run.path}: {field}={getattr(info, field)!r} differs from another run of "
                           f"{info.row} on {info.benchmark} ({getattr(rep, field)!r})")
    merged = rep.by_seed.setdefault(info.seed, [])
    for r in run.results:
      key = (info.row, info.benchmark, info.seed, r.key)
      if key in seen:
        raise ResultsError(f"task {r.task_id!r} (sample {r.sample}) of {info.row} on "
                           f"{info.benchmark} (seed {info.seed}) is in both {seen[key]} and {run.path}")
      seen[key] = run.path
      merged.append(r)
  return out


def scores(runs: Sequence[Run]) -> dict[tuple[str, str], dict[str, BenchmarkScore]]:
  """(harness, model) -> benchmark -> its scores (the mean over seeds where it was repeated)."""
  return {row: {b: mean_over_seeds(list(rep.seed_scores().values())) for b, rep in by_bench.items()}
          for row, by_bench in _merge(runs).items()}


def _interval(values: list[float], stats: StatsConfig) -> tuple[float | None, float | None]:
  ci = bootstrap_interval(values, stats)
  return ci if ci is not None else (None, None)


def _versus(a: Repeats, b: Repeats, stats: StatsConfig, category: str | None = None) -> str | None:
  """Paired test per task of `a` against `b`: "+d.dd (p=..., n tasks)", d in points; None without
  common tasks."""
  sa, sb = a.task_scores(category), b.task_scores(category)
  common = sorted(set(sa) & set(sb))
  if not common:
    return None
  x, y = [sa[t] for t in common], [sb[t] for t in common]
  delta = 100.0 * float(np.mean(x) - np.mean(y))
  return f"{delta:+.2f} (p={paired_test(x, y, stats):.3g}, {len(common)} tasks)"


def _check_named(name: str, present: Sequence[str], what: str, kind: str) -> None:
  """A ResultsError unless `name` is one of `present` (the runs' model labels, or trained_in values)."""
  names = sorted(set(present))
  if name not in names:
    raise ResultsError(f"{what} {name!r} is the {kind} of no run given; theirs: {', '.join(names) or 'none'}"
                       f"{did_you_mean(name, names)}")


def seeds_table(runs: Sequence[Run], stats: StatsConfig = StatsConfig(), baseline: str | None = None,
                categories: bool = False) -> Table:
  """One row per (harness, model, benchmark) (and category, with `categories`): n seeds, the mean over
  seeds, its bootstrap interval over seeds, the tasks scored, the paper's number; with `baseline` (a
  model label), a paired test per task of each row against that model's row of the same harness and
  benchmark (and category)."""
  merged = _merge(runs)
  if baseline:
    _check_named(baseline, [model for _, model in merged], "baseline", "model label")
  columns = ["harness", "model", "benchmark", *(["category"] if categories else []), "n", "mean",
             f"{stats.confidence:.0%} CI low", f"{stats.confidence:.0%} CI high", "tasks",
             *([] if categories else ["paper"]), *([f"vs {baseline}"] if baseline else [])]
  rows: list[list[Cell]] = []
  for (harness, model), by_bench in merged.items():
    for bench, rep in sorted(by_bench.items()):
      per_seed = rep.seed_scores()
      names = sorted({c for s in per_seed.values() for c in s.categories}) if categories else [None]
      base = merged.get((harness, baseline), {}).get(bench) if baseline and model != baseline else None
      for category in names:
        groups = [s.categories.get(category) if category else s.overall for s in per_seed.values()]
        values = [g.score for g in groups if g is not None and g.score is not None]
        row: list[Cell] = [harness, model, bench, *([category] if categories else []), len(values),
                           float(np.mean(values)) if values else None, *_interval(values, stats),
                           max((g.tasks for g in groups if g is not None), default=0)]
        if not categories:
          row.append(paper.TABLE1.get((harness, model), {}).get(bench))
        if baseline:
          row.append(_versus(rep, base, stats, category) if base is not None else None)
        rows.append(row)
  return Table(columns, rows)


TRAINED_IN_BASES = ("base", "cold_start")  # EvalConfig.trained_in values other than harness names
BASE = TRAINED_IN_BASES[0]


def transfer_tables(runs: Sequence[Run], stats: StatsConfig = StatsConfig(),
                    baseline: str | None = None) -> list[tuple[str, Table]]:
  """(benchmark, table) per benchmark: rows = the harness the policy was trained in (EvalConfig
  `trained_in`: a harness, "base", "cold_start"), columns = the harness it was evaluated in. A cell is
  the benchmark's mean (over tasks of each task's mean over seeds, in percent) with its interval over
  tasks and seeds (`task_bootstrap_interval`): "mean [low, high] n=T tasks x S seeds"; each column's
  "vs `baseline`" (a trained_in value some run states; None: BASE, where a run states it) is the paired
  test per task against the baseline row's run in that harness. Runs that
  do not state `trained_in` are left out; two models in one cell are an error."""
  merged = _merge([r for r in runs if r.info.trained_in is not None])
  if baseline is not None and merged:
    _check_named(baseline, [rep.trained_in for by in merged.values() for rep in by.values()], "baseline",
                 "trained_in")
  baseline = baseline or BASE
  out = []
  for bench in sorted({b for by in merged.values() for b in by}):
    cells: dict[tuple[str, str], tuple[str, Repeats]] = {}
    for (harness, model), by_bench in merged.items():
      if bench not in by_bench:
        continue
      rep = by_bench[bench]
      key = (rep.trained_in, harness)
      if key in cells:
        raise ResultsError(f"{bench}: models {cells[key][0]!r} and {model!r} were both trained in "
                           f"{rep.trained_in!r} and evaluated in {harness}; pass the runs of one of them")
      cells[key] = (model, rep)
    trained = sorted({t for t, _ in cells}, key=lambda t: (t != baseline, t not in TRAINED_IN_BASES, t))
    evaluated = sorted({h for _, h in cells})
    columns = ["trained in", "model"] + [c for h in evaluated for c in (h, f"{h} vs {baseline}")]
    rows = []
    for t in trained:
      models = sorted({cells[(t, h)][0] for h in evaluated if (t, h) in cells})
      row: list[Cell] = [t, ", ".join(models)]
      for h in evaluated:
        if (t, h) not in cells:
          row += [None, None]
          continue
        rep = cells[(t, h)][1]
        row.append(_transfer_cell(rep, stats))
        base = cells.get((baseline, h))
        row.append(_versus(rep, base[1], stats) if base is not None and t != baseline else None)
      rows.append(row)
    out.append((bench, Table(columns, rows)))
  return out


def _transfer_cell(rep: Repeats, stats: StatsConfig) -> str:
  per_task = list(rep.task_seed_scores().values())
  seeds = len(rep.by_seed)
  n = f"n={len(per_task)} tasks x {seeds} seed{'s' if seeds > 1 else ''}"
  if not per_task:
    return f"- {n}"
  text = f"{100.0 * np.mean([np.mean(v) for v in per_task]):.2f}"
  ci = task_bootstrap_interval(per_task, stats)
  if ci is not None:
    text += f" [{100.0 * ci[0]:.2f}, {100.0 * ci[1]:.2f}]"
  return f"{text} {n}"


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
