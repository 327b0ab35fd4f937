"""Scoring a finished workspace: the task's code checker, then (hybrid tasks) the rubric judge.

The checker runs the way the official ClawGym runner does, but never in the agent's workspace:
1. the workspace is copied to a fresh temporary directory (the scoring root), and any `reward/` the
   agent created there is removed;
2. the checker files are written only now, after the harness exited: under the scoring root for
   command checkers (where `reward/reward.sh` and `python3 reward/test.py ...` expect them), in a
   sibling directory for `grade()` checkers (PinchBench calls grade() from outside the workspace);
3. the task's mount dir (e.g. /root/.openclaw/workspace), wherever it appears in the command or the
   checker files, is rewritten to the scoring root, so absolute paths written for the original
   container resolve to the scored copy;
4. the checker runs in a subprocess with the scoring root as working directory, a throwaway HOME and
   TMPDIR and a wall-clock timeout, in a PID namespace of its own where the host allows one (every
   process it starts dies with it, also one that calls setsid), and no network where it can be cut
   off (confined.py; `ScoreResult.details["processes"]` and `["network"]` say which). Its output is
   read with a deadline: a checker returns within its timeout plus a few seconds, whatever it left.

Reading the checker's output: `reward.sh` prints one float as its last stdout line, which is the code
score. Otherwise the last JSON object of stdout is the checker's dict: with a numeric "reward" key
(`main()`-style checkers) that is the code score, else the plain mean of its values (each metric
weighs equally). A bare number as the last line is also a score. A score, and each metric that is
averaged into one, lies in [0, 1] (the checkers' contract). A crash (no score in the output), a
timeout, a non-finite, non-numeric or out-of-range value scores 0 with the reason in `error`.

Known checker blind spot: metrics such as "announcement under 120 words" score 1 when the file does
not exist (empty text has 0 words). `ScoringConfig.strict` (off by default, so official scores are
reproduced) zeroes every metric whose name mentions a file that the prompt or rubric refers to and
the workspace lacks, and recomputes the code score as the mean of the metrics. Matching is by name
(the file's stem, lowercased, without punctuation, inside the metric name): a heuristic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile
from typing import Any

from clawjax.config import NonNegative, Positive
from clawjax.tasks.confined import confinement, run_confined
from clawjax.tasks.judge import JudgeConfig, judge_workspace
from clawjax.tasks.jsonscan import last_json_object
from clawjax.tasks.records import REWARD_DIR, Task, TaskFile
from clawjax.tasks.workspace import write_files

_GRADE_RUNNER = pathlib.Path(__file__).with_name("grade_runner.py")


@dataclasses.dataclass(frozen=True)
class ScoringConfig:
  timeout_s: Positive[float] = 120.0  # wall-clock limit of one checker run (not published; generous default)
  strict: bool = False  # zero metrics about files that do not exist (see module docstring)
  isolate_network: bool = True  # run checkers without network when the machine allows it (confined.py)
  python: str = sys.executable  # interpreter for grade() checkers
  # reward.sh prints only the average; to report the checker's dict too, run reward/check.py once more.
  metrics_from_check_py: bool = True
  tail_chars: NonNegative[int] = 2000  # how much of the checker's stdout/stderr to keep in `details`
  # Put first on the checker's PATH, so its `python3` is this interpreter (and its packages) rather
  # than whatever (e.g. a slow pyenv shim) comes first; () keeps the caller's PATH as is.
  path_prepend: tuple[str, ...] = (os.path.dirname(sys.executable),)


@dataclasses.dataclass
class ScoreResult:
  """code_score: None when the task has no code checker. final_score: the reward; None when the task
  has a rubric that was not judged (no judge configured). Errors are recorded, never raised."""
  code_score: float | None
  metrics: dict[str, float]
  error: str | None
  rubric_score: float | None = None
  final_score: float | None = None
  rubric_notes: str | None = None
  details: dict[str, Any] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------
# Output parsing


class CheckerOutputError(ValueError):
  pass


def _finite(name: str, v: Any) -> float:
  if isinstance(v, bool):
    return float(v)
  if not isinstance(v, (int, float)):
    raise CheckerOutputError(f"metric {name!r} is {v!r}, not a number")
  if not math.isfinite(v):
    raise CheckerOutputError(f"metric {name!r} is {v}, not finite")
  return float(v)


def _unit(name: str, v: float) -> float:
  """A score: in [0, 1], or the checker is broken (a reward of 1e308 would swamp a whole GRPO group)."""
  if not 0.0 <= v <= 1.0:
    raise CheckerOutputError(f"{name} is {v}, outside [0, 1]")
  return v


def score_of_dict(d: dict[str, Any]) -> tuple[float, dict[str, float]]:
  """(code score, numeric metrics) of a checker's dict: its "reward" if numeric, else the mean."""
  if isinstance(d.get("reward"), (int, float)) and not isinstance(d.get("reward"), bool):
    # main()-style checkers may add counts or messages beside the reward: keep the numbers.
    metrics = {k: _finite(k, v) for k, v in d.items() if isinstance(v, (int, float))}
    return _unit("the checker's reward", metrics["reward"]), metrics
  if not d:
    raise CheckerOutputError("the checker printed an empty dict")
  metrics = {k: _unit(f"metric {k!r}", _finite(k, v)) for k, v in d.items()}
  return sum(metrics.values()) / len(metrics), metrics


def _last_line_number(text: str) -> float | None:
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  if not lines:
    return None
  try:
    return float(lines[-1])
  except ValueError:
    return None


def parse_checker_output(stdout: str) -> tuple[float, dict[str, float]]:
  """(code score, metrics) from a checker's stdout; raises CheckerOutputError when there is none."""
  number = _last_line_number(stdout)
  if number is not None:
    if not math.isfinite(number):
      raise CheckerOutputError(f"the checker printed a non-finite score {number}")
    _unit("the checker's score", number)
    d = last_json_object(stdout)
    return number, ({} if d is None else
                    {k: _finite(k, v) for k, v in d.items() if isinstance(v, (int, float))})
  d = last_json_object(stdout)
  if d is None:
    raise CheckerOutputError("no score in the checker's output (no float last line, no JSON object)")
  return score_of_dict(d)


# ---------------------------------------------------------------------------------------------------
# Strict mode


_FILE_RE = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z0-9]{1,6})(?![\w])")


def referenced_files(task: Task) -> set[str]:
  """Workspace-relative files the prompt (`name.ext`, bare or quoted) or the rubric refers to and the
  checker's own files also name (which keeps words like "Node.js" in a prompt out)."""
  found = set()
  for m in _FILE_RE.finditer(task.prompt):
    path = m.group(1)
    if path.startswith(task.mount_dir.strip("/") + "/"):
      path = path[len(task.mount_dir.strip("/")) + 1:]
    found.add(path)
  if task.rubric is not None:
    found.update(r.file_path.lstrip("/") for r in task.rubric.rules if r.file_path)
  checker_text = b"".join(f.read() for f in task.checker.files) if task.checker else b""
  return {f for f in found if pathlib.PurePosixPath(f).name.encode() in checker_text}


def _norm(s: str) -> str:
  return re.sub(r"[^a-z0-9]", "", s.lower())


def strict_zeroed_metrics(task: Task, workspace: pathlib.Path,
                          metrics: dict[str, float]) -> list[str]:
  """Names of the metrics that mention a referenced file missing from the workspace."""
  missing = [f for f in referenced_files(task) if not (workspace / f).exists()]
  stems = {_norm(pathlib.PurePosixPath(f).stem) for f in missing}
  stems = {s for s in stems if len(s) >= 3}
  return [k for k in metrics if k != "reward" and any(s in _norm(k) for s in stems)]


# ---------------------------------------------------------------------------------------------------
# Running the checker


def _rewrite(data: bytes, mount_dir: str, root: pathlib.Path) -> bytes:
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    return data
  return text.replace(mount_dir.rstrip("/"), str(root)).encode("utf-8")


def _copy_workspace(src: pathlib.Path, dst: pathlib.Path) -> None:
  """Directories, regular files and symlinks (as links); FIFOs, sockets and devices are skipped (a
  FIFO left by the agent would block the copy)."""
  def special(d: str, names: list[str]) -> list[str]:
    return [n for n in names if not (os.path.islink(p := os.path.join(d, n)) or os.path.isdir(p)
                                     or os.path.isfile(p))]
  shutil.copytree(src, dst, symlinks=True, ignore=special)


def run_checker(task: Task, workspace: str | os.PathLike[str], config: ScoringConfig = ScoringConfig(),
                transcript: list[Any] | None = None) -> ScoreResult:
  """The code score of `workspace` under the task's checker; final_score is left for `score`."""
  if task.checker is None:
    return ScoreResult(code_score=None, metrics={}, error=None)
  workspace = pathlib.Path(workspace)
  if not workspace.is_dir():
    return ScoreResult(code_score=0.0, metrics={}, error=f"workspace {workspace} does not exist")
  try:
    return _run_checker(task, workspace, config, transcript)
  except OSError as e:  # e.g. an unreadable file in the workspace, a full disk
    return ScoreResult(code_score=0.0, metrics={}, error=f"could not run the checker: {e}")


def _run_checker(task: Task, workspace: pathlib.Path, config: ScoringConfig,
                 transcript: list[Any] | None) -> ScoreResult:
  checker = task.checker
  details: dict[str, Any] = confinement(config.isolate_network).details()
  with tempfile.TemporaryDirectory(prefix="clawjax-score-") as tmp:
    tmp_path = pathlib.Path(tmp)
    root = tmp_path / "workspace"
    _copy_workspace(workspace, root)
    # Files the agent planted at reward/ must not stand in for (or beside) the real checker.
    planted = root / REWARD_DIR
    if planted.is_symlink() or planted.is_file():
      planted.unlink()
    elif planted.is_dir():
      shutil.rmtree(planted)
    checker_root = root if checker.kind == "command" else tmp_path / "checker"
    write_files(tuple(TaskFile(path=f.path, content=_rewrite(f.read(), task.mount_dir, root),
                               source=f.source) for f in checker.files), checker_root)
    for d in ("home", "tmp"):
      (tmp_path / d).mkdir()
    path = os.pathsep.join([*config.path_prepend, os.environ.get("PATH", "/usr/bin:/bin")])
    env = {"PATH": path, "HOME": str(tmp_path / "home"),
           "TMPDIR": str(tmp_path / "tmp"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1",
           "WORKSPACE": str(root)}
    if checker.kind == "command":
      command = _rewrite(checker.command.encode("utf-8"), task.mount_dir, root).decode("utf-8")
      argv = ["bash", "-c", command]
    else:
      transcript_path = tmp_path / "transcript.json"
      transcript_path.write_text(json.dumps(transcript or []), encoding="utf-8")
      argv = [config.python, str(_GRADE_RUNNER), str(checker_root / checker.entry), str(root),
              str(transcript_path)]
    run = run_confined(argv, root, env, config.timeout_s, confinement(config.isolate_network))
    details.update(returncode=run.returncode, wall_s=round(run.wall_s, 3),
                   stdout_tail=run.stdout[-config.tail_chars:],
                   stderr_tail=run.stderr[-config.tail_chars:])
    if run.returncode is None:
      return ScoreResult(code_score=0.0, metrics={}, details=details,
                         error=f"checker timed out after {config.timeout_s:g} s and was killed ({details['processes']})")
    try:
      code, metrics = parse_checker_output(run.stdout)
    except CheckerOutputError as e:
      why = f"checker exited with status {run.returncode}" if run.returncode else "checker output"
      last_err = (run.stderr.strip().splitlines() or [""])[-1][:300]
      return ScoreResult(code_score=0.0, metrics={}, details=details,
                         error=f"{why}: {e}" + (f" (stderr: {last_err})" if last_err else ""))
    official_entry = checker.command == f"bash {REWARD_DIR}/reward.sh"
    if (not metrics and config.metrics_from_check_py and official_entry
        and (root / REWARD_DIR / "check.py").is_file()):
      metrics = _metrics_from_check_py(root, env, config, details)
    if config.strict and metrics:
      zeroed = strict_zeroed_metrics(task, workspace, metrics)
      if zeroed:
        metrics = {k: (0.0 if k in zeroed else v) for k, v in metrics.items()}
        plain = [v for k, v in metrics.items() if k != "reward"]
        code = sum(plain) / len(plain)
        details["strict_zeroed"] = zeroed
  return ScoreResult(code_score=code, metrics=metrics, error=None, details=details)


def _metrics_from_check_py(root: pathlib.Path, env: dict[str, str], config: ScoringConfig,
                           details: dict[str, Any]) -> dict[str, float]:
  run = run_confined(["python3", f"{REWARD_DIR}/check.py", str(root)], root, env, config.timeout_s,
                     confinement(config.isolate_network))
  d = last_json_object(run.stdout) if run.returncode is not None else None
  try:
    return score_of_dict(d)[1] if d else {}
  except CheckerOutputError as e:
    details["metrics_error"] = str(e)
    return {}


# ---------------------------------------------------------------------------------------------------
# Code + rubric


def combine(task: Task, code: float | None, rubric: float | None,
            code_weight: float = 0.7, rubric_weight: float = 0.3) -> float | None:
  """The final score: code alone, rubric alone, or their weighted sum for hybrid tasks (the task's own
  `code_weight`, e.g. PinchBench's grading_weights, overrides the defaults)."""
  if task.rubric is None:
    return code
  if rubric is None:
    return None
  if task.checker is None or code is None:
    return rubric
  if task.code_weight is not None:
    code_weight, rubric_weight = task.code_weight, 1.0 - task.code_weight
  return code_weight * code + rubric_weight * rubric


async def score_async(task: Task, workspace: str | os.PathLike[str], *,
                      config: ScoringConfig = ScoringConfig(),
                      judge: JudgeConfig | None = None,
                      transcript: list[Any] | None = None) -> ScoreResult:
  """Code checker (in a worker thread), then the rubric judge when `judge` (a JudgeConfig) is given
  and the task has a rubric. Never raises for a bad checker or judge: errors are recorded."""
  result = await asyncio.to_thread(run_checker, task, workspace, config, transcript)
  if task.rubric is not None and judge is not None:
    verdict = await judge_workspace(task, workspace, judge, transcript=transcript)
    result.rubric_score = verdict.score
    result.rubric_notes = verdict.notes
    result.details["rubric"] = verdict.to_json()
    if verdict.error:  # the rubric scored 0 after every attempt failed
      result.error = "; ".join(filter(None, [result.error, f"judge: {verdict.error}"]))
    result.final_score = combine(task, result.code_score, verdict.score,
                                 judge.code_weight, judge.rubric_weight)
  else:
    result.final_score = combine(task, result.code_score, None)
  return result


def score(task: Task, workspace: str | os.PathLike[str], *, config: ScoringConfig = ScoringConfig(),
          judge: JudgeConfig | None = None, transcript: list[Any] | None = None) -> ScoreResult:
  """Synchronous `score_async` (not from inside a running event loop)."""
  return asyncio.run(score_async(task, workspace, config=config, judge=judge, transcript=transcript))
