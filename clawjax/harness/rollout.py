"""One harness rollout against the shim, end to end, and a concurrent runner for many.

A rollout: register with the shim (`POST /rollouts`) -> fresh workspace with the task's input files ->
the harness in the sandbox (wall-clock timeout, process-group kill) -> settle (poll `GET /rollouts/{id}`
until the call count and in-flight count stay unchanged over `settle_checks` polls, bounded by
`settle_timeout_s`) -> `POST /rollouts/{id}/finish` -> score the workspace (the task's checker, outside
the sandbox, only now) -> one `clawjax.rollout/1` record.

Status of the record (only "ok" rollouts are trained on; the others are counted):
  ok       the harness ran and the workspace was scored; reward = the final score.
  timeout  the harness ran past `timeout_s` and was killed.
  failed   the shim could not be reached, the sandbox could not start, the harness made no call, or it
           exited non-zero right after a failed call (an HTTP failure it gave up on); the reason ends with
           the harness's own last words (`Adapter.last_words`: "error: Prompt is too long").
  error    the rollout ran but has no reward (the checker or judge produced no score).
A harness that exits non-zero after a successful last call (e.g. it hit its own turn limit) is "ok":
the checker decides its reward.

Every record's `extra` says which isolation the harness ran under (`sandbox.isolation` names the fields).
A rollout's dirs lie in this process's run dir, WORK_ROOT/clawjax-rollouts/<run id>/<rollout id>/ (see
rundirs.py: a killed run's are removed by the next start).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import secrets
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clawjax.calllog import CallLogWriter, RolloutRecord
from clawjax.config import Count, NonNegative, Positive
from clawjax.cpus import parse_cpu_list
from clawjax.harness import rundirs, sandbox
from clawjax.harness.adapters import Adapter, HarnessOptions, get_adapter
from clawjax.harness.install import InstallError
from clawjax.harness.pool import run_concurrently
from clawjax.tasks import Task
from clawjax.tasks.confined import DRAIN_S
from clawjax.tasks.judge import JudgeConfig
from clawjax.tasks.scoring import ScoringConfig, score
from clawjax.tasks.workspace import make_workspace

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  timeout_s: Positive[float] = 1800.0  # harness wall clock (not published; the harness's own deadline)
  settle_checks: Count = 3         # unchanged consecutive polls that count as settled
  settle_interval_s: Positive[float] = 0.5  # between polls
  settle_timeout_s: Positive[float] = 60.0  # give up settling after this long (the record says so)
  http_timeout_s: Positive[float] = 30.0  # one admin API request
  work_root: str | None = None     # holds clawjax-rollouts/<run id>/<rollout id>/; None: system temp
  keep_dirs: bool = False          # keep the workspace, HOME and harness output after the rollout
  output_tail_chars: NonNegative[int] = 4000  # of the harness's stdout/stderr kept in the record's `extra`
  harness: HarnessOptions = HarnessOptions()
  sandbox: sandbox.SandboxConfig = sandbox.SandboxConfig()
  scoring: ScoringConfig = ScoringConfig()
  judge: JudgeConfig | None = None  # rubric judge for hybrid tasks; None: code score only
  # CPU cores (a cpu list, "0-3,8") of the rollout side of the process that runs rollouts: its shim
  # (thread or worker processes), the threads that drive rollouts and what they start (sandboxes,
  # checkers). On a host shared with the learner this keeps rollouts off the learner's cores (see
  # clawjax.cpus); "" leaves every affinity as it is.
  cores: str = ""
  # Seconds a GRPO group of a training step may take, from its first rollout's start: past it, the
  # rollouts still running are given up and the group is dropped as `overdue` (counted), and the step
  # goes on without it (clawjax.run.deadline). None: 2 x `rollout_bound_s()`, since a group's last
  # rollout may wait for a free slot as long as a whole rollout takes.
  group_deadline_s: float | None = None

  def __post_init__(self):
    parse_cpu_list(self.cores, "config.rollout.cores")
    if self.group_deadline_s is not None and not self.group_deadline_s > 0:
      raise ValueError(f"config.rollout.group_deadline_s: {self.group_deadline_s} must be > 0 (or None: derived)")

  def rollout_bound_s(self) -> float:
    """How long one rollout may take by its own timeouts: the harness's (timeout_s, then the kill's
    grace), settling, four shim requests, the checker twice (reward.sh, then check.py for its metrics:
    each its timeout and its output's drain) and every attempt of the judge."""
    judge = 0.0 if self.judge is None else (self.judge.retries + 1) * self.judge.timeout_s
    return (self.timeout_s + self.sandbox.kill_grace_s + self.settle_timeout_s + 4 * self.http_timeout_s
            + 2 * (self.scoring.timeout_s + DRAIN_S) + judge)

  def group_deadline(self) -> float:
    return self.group_deadline_s if self.group_deadline_s is not None else 2 * self.rollout_bound_s()


@dataclasses.dataclass
class RolloutOutcome:
  record: RolloutRecord
  rollout_dir: pathlib.Path | None  # None once removed (keep_dirs=False)
  calls: list[dict[str, Any]]       # the shim's per-call summaries at finish


class ShimError(RuntimeError):
  pass


class ShimClient:
  """The shim's control routes over HTTP, authenticated with the admin token (the trainer's; never
  passed into a sandbox)."""

  def __init__(self, url: str, timeout_s: float, admin_token: str | None = None):
    self.url, self.timeout_s = url.rstrip("/"), timeout_s
    self.headers = {"content-type": "application/json"}
    if admin_token:
      self.headers["Authorization"] = f"Bearer {admin_token}"

  def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(self.url + path, data=data, method=method, headers=self.headers)
    try:
      with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
        return json.loads(resp.read())
    except urllib.error.HTTPError as e:
      raise ShimError(f"{method} {path}: HTTP {e.code}: {e.read()[:500]!r}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
      raise ShimError(f"{method} {path}: {e}") from None

  def create(self, task_id: str, harness: str, rollout_id: str) -> dict[str, Any]:
    return self._request("POST", "/rollouts",
                         {"task_id": task_id, "harness": harness, "rollout_id": rollout_id})

  def get(self, rollout_id: str) -> dict[str, Any]:
    return self._request("GET", f"/rollouts/{rollout_id}")

  def finish(self, rollout_id: str) -> dict[str, Any]:
    """The finished rollout's summary; ShimError when the shim marked it failed (a call it could not
    record), which makes the rollout `failed` with the shim's reason."""
    summary = self._request("POST", f"/rollouts/{rollout_id}/finish", {})
    if summary.get("failed"):
      raise ShimError(f"the shim marked rollout {rollout_id} failed: {summary['failed']}")
    return summary


def settle(client: ShimClient, rollout_id: str, config: RolloutConfig) -> tuple[dict[str, Any], bool]:
  """Polls until (call count, in flight) is unchanged with nothing in flight over `settle_checks`
  polls; returns (last summary, settled?)."""
  deadline = time.monotonic() + config.settle_timeout_s
  last, same = None, 0
  while True:
    summary = client.get(rollout_id)
    state = (len(summary.get("calls", [])), summary.get("inflight", 0))
    same = same + 1 if state == last and state[1] == 0 else 0
    last = state
    if same >= config.settle_checks:
      return summary, True
    if time.monotonic() >= deadline:
      return summary, False
    time.sleep(config.settle_interval_s)


def _tail(path: pathlib.Path, n: int) -> str:
  text = path.read_text(errors="replace") if path.exists() else ""
  return text[-n:]


def _status(run: sandbox.SandboxResult, calls: list[dict[str, Any]]) -> tuple[str, str | None]:
  if run.timed_out:
    return "timeout", f"harness ran past its timeout ({run.wall_s:.0f} s)"
  if not calls:
    return "failed", f"the harness made no model call (exit {run.returncode})"
  if run.returncode != 0 and calls[-1].get("status") != "ok":
    return "failed", f"the harness exited {run.returncode} after a failed call"
  return "ok", None


def task_source_path(task: Task) -> pathlib.Path:
  """The file or directory a task was loaded from (its checker is in there): "file.jsonl:12" is the
  file, a directory task's `data_entry.json` stands for its directory."""
  path, sep, line = task.source.rpartition(":")
  p = pathlib.Path(path if sep and line.isdigit() else task.source).resolve()
  return p.parent if p.name == "data_entry.json" else p


def run_rollout(shim_url: str, task: Task, harness: str | Adapter, config: RolloutConfig,
                writer: CallLogWriter | None = None, rollout_id: str | None = None, *,
                admin_token: str | None = None, record_extra: Mapping[str, Any] | None = None) -> RolloutOutcome:
  """Runs one rollout; never raises for a harness, sandbox or shim failure (they become the status).
  `admin_token` opens the shim's control routes; `record_extra` goes into the record's `extra` (e.g.
  which process of a run ran it)."""
  adapter = get_adapter(harness) if isinstance(harness, str) else harness
  rollout_id = rollout_id or f"r-{secrets.token_hex(16)}"
  client = ShimClient(shim_url, config.http_timeout_s, admin_token)
  rollout_dir = rundirs.current_run().dir(rundirs.rollouts_root(config.work_root)) / rollout_id
  rollout_dir.mkdir()
  extra: dict[str, Any] = {"task_source": task.source, "sandbox_mode": config.sandbox.mode, **(record_extra or {})}
  calls: list[dict[str, Any]] = []
  status, reward, registered, finished = "failed", None, False, False
  t0 = time.time()
  try:
    info = client.create(task.task_id, adapter.name, rollout_id)
    registered = True
    workspace = make_workspace(task, rollout_dir)
    home = rollout_dir / "home"
    home.mkdir()
    options = config.harness
    if options.context_window is None:
      options = dataclasses.replace(options, context_window=info.get("context_window"))
    cmd = adapter.command(info["base_url"], info["api_key"], task.prompt, home, options)
    port = urllib.parse.urlsplit(info["base_url"]).port
    run = sandbox.run(sandbox.SandboxSpec(
        argv=cmd.argv, workspace=workspace, home=home, env=cmd.env, timeout_s=config.timeout_s,
        stdout_path=rollout_dir / "stdout.txt", stderr_path=rollout_dir / "stderr.txt",
        ro_paths=cmd.ro_paths, loopback_ports=[port] if port else [],
        workspace_mount=task.mount_dir, hidden_paths=[task_source_path(task)]), config.sandbox)
    extra.update(exit_code=run.returncode, harness_wall_s=round(run.wall_s, 3), **run.isolation())
    stdout = _tail(rollout_dir / "stdout.txt", 1 << 20)
    extra["harness_result"] = adapter.result(stdout)
    extra["stdout_tail"] = stdout[-config.output_tail_chars:]
    extra["stderr_tail"] = _tail(rollout_dir / "stderr.txt", config.output_tail_chars)
    _, extra["settled"] = settle(client, rollout_id, config)
    calls = client.finish(rollout_id).get("calls", [])
    finished = True
    extra["n_calls"] = len(calls)
    extra["log_path"] = info.get("log_path")
    status, reason = _status(run, calls)
    if reason:  # with the harness's own last words, which say why where our reason cannot
      words = adapter.last_words(stdout, extra["stderr_tail"])
      extra["reason"] = f"{reason}; {words}" if words else reason
    if status == "ok":
      transcript = adapter.transcript(home)
      extra["transcript_events"] = len(transcript)
      result = score(task, workspace, config=config.scoring, judge=config.judge,
                     transcript=transcript)
      extra["score"] = {k: v for k, v in result.to_json().items() if k != "details"}
      reward = result.final_score
      if reward is None:
        status, extra["reason"] = "error", f"no score: {result.error or 'rubric not judged'}"
  except (ShimError, sandbox.SandboxError, InstallError, OSError) as e:
    status, reward = "failed", None
    extra["reason"] = f"{type(e).__name__}: {e}"
    log.warning("rollout %s (%s, %s) failed: %s", rollout_id, task.task_id, adapter.name, e)
    if registered and not finished:
      try:  # stop the shim routing to it; its log stays as evidence
        client.finish(rollout_id)
      except ShimError:
        pass
  extra["wall_s"] = round(time.time() - t0, 3)
  record = RolloutRecord(rollout_id=rollout_id, task_id=task.task_id, harness=adapter.name,
                         reward=reward, status=status, extra=extra)
  if writer is not None:
    writer.write(record)
  if not config.keep_dirs:
    shutil.rmtree(rollout_dir, ignore_errors=True)
  return RolloutOutcome(record, rollout_dir if config.keep_dirs else None, calls)


def run_rollouts(shim_url: str, jobs: Sequence[tuple[Task, str]], config: RolloutConfig,
                 writer: CallLogWriter | None = None, concurrency: int = 4,
                 on_done: Callable[[RolloutOutcome], None] | None = None, *,
                 admin_token: str | None = None) -> list[RolloutOutcome]:
  """Runs (task, harness) jobs `concurrency` at a time; outcomes in job order. Logs status counts."""
  outcomes = run_concurrently(
      lambda job: run_rollout(shim_url, job[0], job[1], config, writer, admin_token=admin_token), jobs,
      concurrency, on_result=on_done)
  counts = Counter(o.record.status for o in outcomes)
  log.info("rollouts: %s", dict(counts))
  return outcomes
