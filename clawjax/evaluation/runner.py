"""One evaluation run: every task (x `num_samples`) through the harness against the shim, resumable.

  run_eval(config, workdir) -> Run

1. Tasks are loaded (a broken task is logged and left out, never stops the run) and selected
   (`task_ids`, `max_tasks`).
2. `workdir/run.json` pins what the directory evaluates; resuming with another benchmark, harness,
   model label or task source is an error. Rollouts already in `results.jsonl` are skipped unless
   their last status is in `rerun_statuses` (by default only infrastructure failures are redone).
3. The shim: `shim_url` connects to a running one; otherwise one is started in this process with the
   configured backend (call logs in `workdir/calls/`), or with a `backend` the caller passes (a
   trainer's engine, or a scripted policy in tests).
4. Rollouts run `concurrency` at a time (clawjax.harness.rollout.run_rollout), each reported to
   `results.jsonl` as it finishes, with a progress bar; an unexpected exception in one rollout is
   recorded as "failed" for that rollout only.
5. `summary.md` / `summary.json` (report.py) are rewritten from the results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pathlib
import re
import secrets
from collections.abc import Iterator, Sequence

from clawjax import tasks as task_lib
from clawjax.calllog import CallLogWriter
from clawjax.evaluation import report
from clawjax.evaluation.config import EvalConfig
from clawjax.evaluation.results import ResultsError, ResultsWriter, TaskResult, latest, load_results
from clawjax.harness.pool import run_concurrently
from clawjax.harness.rollout import RolloutConfig, RolloutOutcome, run_rollout
from clawjax.serving.backends.base import Backend, create_backend
from clawjax.serving.server import ShimThread
from clawjax.tasks import Task
from clawjax.text.templates import load_template

log = logging.getLogger(__name__)


class EvalError(RuntimeError):
  pass


def select_tasks(config: EvalConfig) -> list[Task]:
  try:
    tasks = task_lib.select_tasks(config.tasks, config.task_ids)
  except ValueError as e:  # An unknown id is the user's config: eval.py prints it without a trace.
    raise EvalError(str(e)) from None
  if config.max_tasks:
    tasks = tasks[:config.max_tasks]
  ids = [t.task_id for t in tasks]
  if len(set(ids)) != len(ids):
    dup = sorted({i for i in ids if ids.count(i) > 1})
    raise EvalError(f"{config.tasks}: task ids {dup[:5]} occur more than once")
  return tasks


def run_info(config: EvalConfig) -> report.RunInfo:
  return report.RunInfo(benchmark=config.benchmark, harness=config.harness,
                        model_label=config.label, tasks=str(config.tasks), unscored=config.unscored)


def _pin_run_info(workdir: pathlib.Path, info: report.RunInfo) -> None:
  old = report.read_run_info(workdir)
  if old is None:
    (workdir / report.RUN_FILE).write_text(json.dumps(dataclasses.asdict(info), indent=2) + "\n")
    return
  diff = {k: (v, getattr(info, k)) for k, v in dataclasses.asdict(old).items()
          if v != getattr(info, k)}
  if diff:
    raise EvalError(f"{workdir / report.RUN_FILE}: this directory holds another run "
                    f"({', '.join(f'{k}: {a!r} now {b!r}' for k, (a, b) in diff.items())}); "
                    "use another --workdir")


@contextlib.contextmanager
def shim_session(config: EvalConfig, log_dir: pathlib.Path,
                 backend: Backend | None = None) -> Iterator[str]:
  """The shim's root URL: `config.shim_url`, or an in-process shim started for the block."""
  if config.shim_url:
    yield config.shim_url
    return
  engine = config.engine
  template = load_template(engine.template or engine.model, engine.template_family)
  if backend is None:
    options = dict(engine.options)
    if engine.backend == "scripted":
      options["template"] = template  # the script is rendered with the shim's own template
    backend = create_backend(engine.backend, url=engine.url, model=engine.model, **options)
  shim_config = dataclasses.replace(config.shim, log_dir=str(log_dir))
  with ShimThread(shim_config, backend, template) as shim:
    log.info("shim (%s backend) at %s, call logs in %s", engine.backend, shim.url, log_dir)
    yield shim.url


def _rollout_id(task_id: str, sample: int) -> str:
  """Readable and unique across reruns (the shim refuses an id whose log already exists)."""
  stem = re.sub(r"[^A-Za-z0-9._-]+", "_", task_id)[:80].lstrip("._-") or "task"
  return f"{stem}-s{sample}-{secrets.token_hex(4)}"


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


def rollout_config(config: EvalConfig, task: Task) -> RolloutConfig:
  """The rollout settings for `task`: with `task_timeouts`, its own wall clock where it has one."""
  if not (config.task_timeouts and task.timeout_s):
    return config.rollout
  return dataclasses.replace(config.rollout, timeout_s=task.timeout_s, harness=dataclasses.replace(
      config.rollout.harness, timeout_s=task.timeout_s))


def _run_one(shim_url: str, task: Task, sample: int, config: EvalConfig,
             writer: CallLogWriter) -> TaskResult:
  rollout_id = _rollout_id(task.task_id, sample)
  try:
    outcome = run_rollout(shim_url, task, config.harness, rollout_config(config, task), writer,
                          rollout_id)
    return to_result(task, sample, config.harness, outcome)
  except Exception as e:  # pylint: disable=broad-except  (one rollout's bug must not end the run)
    log.exception("rollout %s of task %s crashed", rollout_id, task.task_id)
    return TaskResult(task_id=task.task_id, sample=sample, category=task.category,
                      harness=config.harness, status="failed", code_score=None, rubric_score=None,
                      final_score=None, rollout_id=rollout_id, calls=0, input_tokens=0,
                      output_tokens=0, wall_s=0.0, error=f"{type(e).__name__}: {e}")


def pending(tasks: Sequence[Task], config: EvalConfig,
            done: dict[tuple[str, int], TaskResult]) -> list[tuple[Task, int]]:
  """The (task, sample) rollouts still to run."""
  return [(t, s) for t in tasks for s in range(config.num_samples)
          if (t.task_id, s) not in done or done[(t.task_id, s)].status in config.rerun_statuses]


def run_eval(config: EvalConfig, workdir: str | pathlib.Path,
             backend: Backend | None = None) -> report.Run:
  """Runs (or resumes) the evaluation in `workdir`; returns the run with the selected tasks' results."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  info = run_info(config)
  _pin_run_info(workdir, info)
  tasks = select_tasks(config)
  results_path = workdir / report.RESULTS_FILE
  done = latest(load_results(results_path))
  jobs = pending(tasks, config, done)
  log.info("%d tasks x %d samples: %d rollouts to run, %d already done", len(tasks),
           config.num_samples, len(jobs), len(tasks) * config.num_samples - len(jobs))
  if jobs:
    with contextlib.ExitStack() as stack:
      shim_url = stack.enter_context(shim_session(config, workdir / report.CALLS_DIR, backend))
      results = stack.enter_context(ResultsWriter(results_path))
      rollouts = stack.enter_context(CallLogWriter(workdir / report.ROLLOUTS_FILE))

      def record(result: TaskResult) -> None:
        results.write(result)
        done[result.key] = result

      run_concurrently(lambda job: _run_one(shim_url, job[0], job[1], config, rollouts), jobs,
                       config.concurrency, on_result=record, desc=f"eval {config.harness}",
                       progress=config.progress, score=lambda r: r.final_score, status=lambda r: r.status)
  wanted = {(t.task_id, s) for t in tasks for s in range(config.num_samples)}
  run = report.Run(str(workdir), info, [r for k, r in done.items() if k in wanted])
  if len(run.results) != len(wanted):
    raise ResultsError(f"{results_path}: {len(wanted) - len(run.results)} rollouts have no result")
  report.write_summary(run)
  return run
