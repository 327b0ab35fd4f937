"""One evaluation run: every task (x `num_samples`) through the harness against the shim, resumable.

  run_eval(config, workdir) -> Run

1. Tasks are loaded (a broken task is logged and left out, never stops the run) and selected
   (`task_ids`, `max_tasks`).
2. `workdir/run.json` pins what the directory evaluates; resuming with another benchmark, harness,
   model label or task source is an error. Rollouts already in `results.jsonl` are skipped unless
   their last status is in `rerun_statuses` (by default only infrastructure failures are redone).
3. The policy session (clawjax.run.session, as in training): `shim_url` connects to a running shim;
   otherwise one is started in this process in front of the configured engine (call logs in
   `workdir/calls/`), or of a `backend` the caller passes (a scripted policy in tests).
4. Rollouts run `concurrency` at a time, each reported to `results.jsonl` as it finishes, with a
   progress bar.
5. `summary.md` / `summary.json` (report.py) are rewritten from the results; summary.json also says
   which isolation the rollouts ran under, environment.json what the run ran on, config.json the
   resolved config; then `report.html` (clawjax/report/run.py) shows it all with the rollouts' trees.

With several processes (`config.distributed`, see `run_eval`) each runs its share of the tasks into files
of its own, and process 0 merges their results into the one `results.jsonl` at the end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Sequence

from clawjax import config as config_lib
from clawjax import distributed
from clawjax.calllog import CallLogWriter
from clawjax.evaluation import report
from clawjax.evaluation.config import EvalConfig
from clawjax.evaluation.results import ResultsError, ResultsWriter, TaskResult, latest, load_results
from clawjax.harness.rollout import RolloutConfig, RolloutOutcome
from clawjax.report.run import write_report
from clawjax.run.session import PolicySession, RolloutJob
from clawjax.run.start import start_run
from clawjax.serving.backends.base import Backend
from clawjax.tasks import Task, select_tasks

log = logging.getLogger(__name__)


class EvalError(RuntimeError):
  pass


def run_info(config: EvalConfig) -> report.RunInfo:
  return report.RunInfo(benchmark=config.benchmark, harness=config.harness, model_label=config.label,
                        tasks=str(config.tasks), unscored=config.unscored, seed=config.seed,
                        trained_in=config.trained_in)


def _pin_run_info(workdir: pathlib.Path, info: report.RunInfo, primary: bool) -> None:
  """Writes run.json, or checks it against a run already there: a directory holds one run's results. One
  that holds none yet (its start failed) takes the new run's (process 0 rewrites it, the others check)."""
  old = report.read_run_info(workdir)
  recorded = any(f.exists() and f.stat().st_size for f in _result_files(workdir))
  if old is None or (primary and not recorded):
    (workdir / report.RUN_FILE).write_text(json.dumps(dataclasses.asdict(info), indent=2) + "\n")
    return
  diff = {k: (v, getattr(info, k)) for k, v in dataclasses.asdict(old).items()
          if v != getattr(info, k)}
  if diff:
    raise EvalError(f"{workdir / report.RUN_FILE}: this directory holds another run "
                    f"({', '.join(f'{k}: {a!r} now {b!r}' for k, (a, b) in diff.items())}); "
                    "use another --workdir")


def to_result(task: Task, sample: int, harness: str, outcome: RolloutOutcome) -> TaskResult:
  rec, extra = outcome.record, outcome.record.extra
  score = extra.get("score") or {}
  return TaskResult(
      task_id=task.task_id, sample=sample, category=task.category, harness=harness,
      status=rec.status, code_score=score.get("code_score"), rubric_score=score.get("rubric_score"),
      final_score=rec.reward if rec.status == "ok" else None, rollout_id=rec.rollout_id,
      calls=len(outcome.calls), input_tokens=sum(c.get("input_tokens", 0) for c in outcome.calls),
      output_tokens=sum(c.get("output_tokens", 0) for c in outcome.calls),
      wall_s=float(extra.get("wall_s", 0.0)), error=extra.get("reason") or score.get("error"),
      metrics=dict(score.get("metrics") or {}),
      rollout_dir=str(outcome.rollout_dir) if outcome.rollout_dir else None)


def rollout_config(config: EvalConfig, task: Task) -> RolloutConfig | None:
  """The rollout settings for `task` when not the run's: with `task_timeouts`, its own wall clock
  where it has one."""
  if not (config.task_timeouts and task.timeout_s):
    return None
  return dataclasses.replace(config.rollout, timeout_s=task.timeout_s, harness=dataclasses.replace(
      config.rollout.harness, timeout_s=task.timeout_s))


def pending(tasks: Sequence[Task], config: EvalConfig,
            done: dict[tuple[str, int], TaskResult]) -> list[RolloutJob]:
  """The (task, sample) rollouts still to run."""
  return [RolloutJob(t, config.harness, s, rollout_config(config, t)) for t in tasks
          for s in range(config.num_samples)
          if (t.task_id, s) not in done or done[(t.task_id, s)].status in config.rerun_statuses]


def _result_files(workdir: pathlib.Path) -> list[pathlib.Path]:
  """The merged results file, then the per-process ones of a multi-process run not merged yet (newer)."""
  return [workdir / report.RESULTS_FILE, *sorted(workdir.glob(distributed.process_files_pattern(report.RESULTS_FILE)))]


def _merge_results(workdir: pathlib.Path, tasks: Sequence[Task]) -> None:
  """Folds the per-process results files into the one results file (written whole, then renamed into
  place), then removes them."""
  files = _result_files(workdir)
  if len(files) == 1:
    return
  order = {t.task_id: i for i, t in enumerate(tasks)}
  merged = sorted(latest(r for f in files for r in load_results(f)).values(),
                  key=lambda r: (order.get(r.task_id, len(order)), r.task_id, r.sample))
  tmp = workdir / f".{report.RESULTS_FILE}.tmp"
  with ResultsWriter(tmp) as out:
    for result in merged:
      out.write(result)
  os.replace(tmp, files[0])
  for part in files[1:]:
    part.unlink()


def run_eval(config: EvalConfig, workdir: str | pathlib.Path,
             backend: Backend | None = None) -> report.Run:
  """Runs (or resumes) the evaluation in `workdir`; returns the run with the selected tasks' results.

  Several processes (config.distributed; the workdir on a filesystem every host sees) split the tasks:
  task i (in selection order) is process i mod P's, all its samples. Each process writes its own
  results.process_<i>.jsonl, rollouts.process_<i>.jsonl and calls/process_<i>/; once all are done, process
  0 merges the results into results.jsonl and writes the summary and the report."""
  distributed.initialize(config.distributed)
  index, count = distributed.process_index(), distributed.process_count()
  primary = index == 0
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  info = run_info(config)
  if primary:
    _pin_run_info(workdir, info, primary)
  distributed.sync("eval: run.json pinned")
  if not primary:
    _pin_run_info(workdir, info, primary)  # checks it against process 0's
  isolation = start_run(config.rollout, workdir, [config.harness], record_environment=primary)
  if primary:
    (workdir / "config.json").write_text(json.dumps(config_lib.to_json(config), indent=2) + "\n")
  try:
    tasks = select_tasks(config.tasks, config.task_ids, config.max_tasks)
  except ValueError as e:  # the user's config (an unknown or duplicate id): eval.py prints it without a trace
    raise EvalError(str(e)) from None
  done = latest(r for f in _result_files(workdir) for r in load_results(f))
  distributed.sync("eval: results read")  # before any process appends to its file
  mine = {t.task_id for i, t in enumerate(tasks) if i % count == index}
  todo = pending(tasks, config, done)
  jobs = [job for job in todo if job.task.task_id in mine]
  log.info("%d tasks x %d samples: %d rollouts already done, %d to run%s", len(tasks), config.num_samples,
           len(tasks) * config.num_samples - len(todo), len(jobs), f" in process {index}" if count > 1 else "")
  if jobs:
    file = lambda name: workdir / distributed.process_file(name, index, count)
    calls_dir = workdir / report.CALLS_DIR / (f"process_{index}" if count > 1 else "")
    with contextlib.ExitStack() as stack:
      session = stack.enter_context(PolicySession(config, calls_dir, backend=backend, shim_url=config.shim_url,
                                                  shim_token_file=config.shim_token_file,
                                                  process_index=index))
      results = stack.enter_context(ResultsWriter(file(report.RESULTS_FILE)))
      rollouts = stack.enter_context(CallLogWriter(file(report.ROLLOUTS_FILE)))

      def record(job: RolloutJob, outcome: RolloutOutcome) -> None:
        results.write(to_result(job.task, job.index, config.harness, outcome))

      session.run(jobs, rollouts, label="eval", desc=f"eval {config.harness}", on_result=record)
  distributed.wait_for_all("eval: rollouts done", config.distributed.finish_timeout_s)
  if primary:
    _merge_results(workdir, tasks)
  distributed.sync("eval: results merged")
  results_path = workdir / report.RESULTS_FILE
  done = latest(load_results(results_path))
  wanted = {(t.task_id, s) for t in tasks for s in range(config.num_samples)}
  run = report.Run(str(workdir), info, [r for k, r in done.items() if k in wanted])
  if len(run.results) != len(wanted):
    raise ResultsError(f"{results_path}: {len(wanted) - len(run.results)} rollouts have no result")
  if primary:
    report.write_summary(run, {"isolation": isolation, "num_processes": count})
    write_report(workdir)
  distributed.sync("eval: summary written")
  return run
