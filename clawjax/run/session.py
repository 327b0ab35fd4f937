"""A run's policy server: the engine (or a remote engine's backend), the shim in front of it, and the pool
that drives harness rollouts through it. Training, its held-out evaluation, the cold-start recording and
benchmark evaluation all run their rollouts through one `PolicySession`.

  with PolicySession(cfg, log_dir=WORKDIR / "calls", policy=model) as session:
    outcomes = session.run(jobs, writer, label="s3")
    session.push(new_model, 3)

`cfg` is any run config with the sections `model`, `engine`, `shim`, `rollout` and the fields
`concurrency`, `progress` (TrainConfig, EvalConfig). The engine is, by `cfg.engine.backend`:
  embedded     an in-process clawjax Engine over `policy` (or `cfg.model` loaded), updated in place;
  sglang/vllm  the server at `cfg.engine.url`, updated from safetensors exported to `cfg.engine.export_dir`;
  any other    a registered backend built from `cfg.engine.options` (e.g. the scripted test policy);
or a `backend` the caller built (the cold-start demonstrator), or no engine at all when `shim_url` names
a shim that already runs.

`cfg.rollout.cores` (a cpu list) pins the rollout side of this process to those cores: the shim's thread
or worker processes, the threads that run rollouts and the sandboxes and checkers they start. The caller's
threads (a trainer's learner) keep theirs.

Rollout ids: `<label>-<task>-<harness>-<index>-<128 random bits in hex>`, readable in a directory
listing, unique across reruns (the shim refuses an id whose log exists) and not guessable.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pathlib
import re
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from clawjax import auth, progress
from clawjax.calllog import CallLogWriter, RolloutRecord
from clawjax.cpus import check_available, parse_cpu_list, pin_thread, thread_pinned
from clawjax.harness.pool import run_concurrently
from clawjax.harness.rollout import RolloutConfig, RolloutOutcome, run_rollout
from clawjax.models.vocab import text_source
from clawjax.run.deadline import GroupClock, Timer
from clawjax.run.settings import EngineSettings, ModelSettings
from clawjax.serving.backends.base import Backend, BackendError, create_backend
from clawjax.serving.front import ShimProcessPool
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.serving.workers import WorkerSpec
from clawjax.tasks import Task
from clawjax.text.templates import ChatTemplate, load_template

log = logging.getLogger(__name__)


class SessionConfig(Protocol):
  model: ModelSettings
  engine: EngineSettings
  shim: ShimConfig
  rollout: RolloutConfig
  concurrency: int
  progress: bool


@dataclasses.dataclass(frozen=True)
class RolloutJob:
  task: Task
  harness: str
  index: int = 0                        # which rollout of the task: a GRPO group member, an eval sample
  config: RolloutConfig | None = None   # settings of this rollout when not the session's (a task timeout)
  group: int | None = None              # the GRPO group (clawjax.train.groups) it belongs to; in its record


def rollout_id(label: str, job: RolloutJob) -> str:
  stem = re.sub(r"[^A-Za-z0-9._-]+", "_", job.task.task_id)[:60].strip("._-") or "task"
  return f"{label}-{stem}-{job.harness}-{job.index}-{secrets.token_hex(16)}"


def clocked_rollout(session: "PolicySession", clock: GroupClock, job: RolloutJob, writer: CallLogWriter,
                    label: str) -> RolloutOutcome:
  """`session.rollout` of the job, given up at its group's deadline (`clock`: clawjax.run.deadline)."""
  rid = rollout_id(label, job)
  return clock.run(job, rid, writer, lambda gated: session.rollout(job, gated, label, rid), session.record_extra(job))


def chat_template(model: ModelSettings) -> ChatTemplate:
  """The tokenizer and chat template the shim renders for `model` (a preset names its tokenizer)."""
  return load_template(text_source(model.template or model.init), model.template_family)


class PolicyUpdateError(RuntimeError):
  """The engine did not take new weights, or reports another version than the one pushed."""


class PolicySession:
  """The policy behind the shim for one run (a context manager). `version` is the policy version of the
  weights it serves, which every call the engine answers records: a trainer names the RL step of its
  weights, the weights after that many updates (0: the ones it starts from, after any SFT stage), so
  that `batch.max_staleness` measures a call's age in updates. A version names one step's weights of
  the run, also across a resume: the resumed run pushes its checkpoint's weights under the checkpoint's
  step, also to an engine that holds a later step's (pushed before a crash that came before their
  checkpoint), which takes the lower version; then it redoes the lost steps. A synchronous run redoes
  them on the rollouts it logged, so the redone weights are the lost ones again (as far as the learner
  is deterministic): a logged call's version still names the weights that sampled it. An asynchronous
  run runs its groups afresh, and calls that the lost weights sampled are never trained."""

  def __init__(self, cfg: SessionConfig, log_dir: str | pathlib.Path, *, policy=None, version: int = 0,
               backend: Backend | None = None, shim_url: str | None = None,
               shim_token_file: str | None = None, seed: int = 0, workdir: str | pathlib.Path | None = None,
               process_index: int = 0):
    self.cfg = cfg
    self.process_index = process_index  # which process of a multi-process run this session serves
    self.engine = None
    self.shim: ShimThread | None = None
    self.version = version
    self._update_targets: list[Backend] = []
    self._export_root = pathlib.Path(cfg.engine.export_dir or pathlib.Path(workdir or log_dir) / "export")
    self._shim_url = shim_url
    self._cores = parse_cpu_list(cfg.rollout.cores, "config.rollout.cores")
    check_available(self._cores, "config.rollout.cores")
    if shim_url:
      self.template = None
      self.backend = None
      # The running shim's admin token: $CLAWJAX_ADMIN_TOKEN, or the file it wrote its token to.
      self.admin_token = auth.client_admin_token(shim_token_file)
      return
    self.template = chat_template(cfg.model)
    shim_config = dataclasses.replace(cfg.shim, log_dir=str(log_dir))
    if backend is None:
      backend = self._make_backend(policy, seed)
    self.backend = backend  # in this process: the weight pushes (and the one shim's engine)
    if cfg.shim.workers > 1:
      # Shim worker processes, each with a backend of its own to the same engine (clawjax.serving.front).
      spec = WorkerSpec(backend=cfg.engine.backend, model=cfg.model.init, backend_url=cfg.engine.url,
                        backend_options=self._backend_options(), template=cfg.model.template,
                        template_family=cfg.model.template_family)
      spec.check_workers(cfg.shim.workers)
      self.shim = ShimProcessPool(shim_config, spec)
    else:
      self.shim = ShimThread(shim_config, backend, self.template)
    self.admin_token = self.shim.admin_token  # held by this process only; never passed to a sandbox

  def _make_backend(self, policy, seed: int) -> Backend:
    settings = self.cfg.engine
    if settings.backend == "embedded":
      # pylint: disable=import-outside-toplevel  (JAX only where this process runs the engine)
      from clawjax.engine.engine import Engine
      from clawjax.models.loading import load_model
      from clawjax.serving.backends.embedded import engine_config
      with progress.phase(f"engine: load {self.cfg.model.init if policy is None else 'the policy'} (embedded)"):
        if policy is None:
          model = self.cfg.model
          policy = load_model(model.init, seed=seed, random_init=model.random_init, **model.overrides).model
        options = {**settings.options, "update_mode": settings.push_mode}
        self.engine = Engine(policy, engine_config(options), version=self.version)
      return create_backend("embedded", engine=self.engine)
    backend = self._remote(settings.url)
    # Weight updates go to each engine server: those behind a router, or the one server.
    self._update_targets = [self._remote(url) for url in settings.workers] or [backend]
    return backend

  def _backend_options(self) -> dict:
    options = dict(self.cfg.engine.options)
    if os.environ.get(auth.ADMIN_TOKEN_ENV) and self.cfg.engine.backend in ("sglang", "vllm"):
      # The engine servers' admin key (their weight update and cache flush) from the cluster's secret,
      # not from a config file.
      options.setdefault("admin_api_key", os.environ[auth.ADMIN_TOKEN_ENV])
    return options

  def _remote(self, url: str | None) -> Backend:
    options = self._backend_options()
    if self.cfg.engine.backend == "scripted":
      options["template"] = self.template  # the script is rendered with the shim's own template
    return create_backend(self.cfg.engine.backend, url=url, model=self.cfg.model.init, **options)

  @property
  def url(self) -> str:
    return self._shim_url or self.shim.url

  def __enter__(self) -> "PolicySession":
    if self.shim is not None:
      # The shim's thread, and the worker processes it starts, on the rollout side's cores.
      with progress.phase("shim: start"), thread_pinned(self._cores):
        self.shim.start()
      log.info("shim (%s backend) at %s, call logs in %s", self.cfg.engine.backend, self.shim.url,
               self.shim.server.config.log_dir)
    return self

  def __exit__(self, *exc) -> None:
    if self.shim is not None:
      pool = isinstance(self.shim, ShimProcessPool)
      for target in dict.fromkeys([*self._update_targets, self.backend]):
        if pool or target is not self.backend:  # a one-process shim closes the backend it serves with
          self.shim.run(target.close())
      self.shim.stop()
    if self.engine is not None:
      self.engine.close()

  def record_extra(self, job: RolloutJob) -> dict[str, Any]:
    """What every record of the job carries beside the rollout's own fields."""
    return {"process_index": self.process_index, **({"group": job.group} if job.group is not None else {})}

  def rollout(self, job: RolloutJob, writer: CallLogWriter, label: str, rid: str | None = None) -> RolloutOutcome:
    """Runs one job (as rollout `rid`, by default a fresh id); it always ends as one rollout record in
    `writer` (thread-safe: call it from many threads at once)."""
    rid = rid or rollout_id(label, job)
    extra = self.record_extra(job)
    pin_thread(self._cores)  # this pool thread, and the sandbox and checker it starts
    try:
      return run_rollout(self.url, job.task, job.harness, job.config or self.cfg.rollout, writer, rid,
                         admin_token=self.admin_token, record_extra=extra)
    except Exception as e:  # pylint: disable=broad-except  (one rollout's bug must not end the run)
      log.exception("rollout %s crashed", rid)
      record = RolloutRecord(rid, job.task.task_id, job.harness, None, "failed",
                             {"reason": f"{type(e).__name__}: {e}", **extra})
      writer.write(record)
      return RolloutOutcome(record, None, [])

  def run(self, jobs: Sequence[RolloutJob], writer: CallLogWriter, *, label: str, desc: str = "",
          on_result: Callable[[RolloutJob, RolloutOutcome], None] | None = None,
          concurrency: int | None = None, group_deadline_s: float | None = None,
          timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer) -> list[RolloutOutcome]:
    """Runs the jobs `concurrency` (default cfg.concurrency) at a time; every job ends as one rollout
    record in `writer`. Outcomes come back in job order; `on_result` sees each as it finishes, in this
    thread. With `group_deadline_s`, the jobs of each GRPO group (`job.group`) that have not ended that
    long after the group's first started are given up (clawjax.run.deadline)."""
    sizes = collections.Counter(job.group for job in jobs if job.group is not None)
    clocks = {g: GroupClock(group_deadline_s, n, timer) for g, n in sizes.items()} if group_deadline_s else {}

    def one(job: RolloutJob) -> tuple[RolloutJob, RolloutOutcome]:
      clock = clocks.get(job.group)
      return job, self.rollout(job, writer, label) if clock is None else clocked_rollout(self, clock, job, writer, label)

    done = run_concurrently(one, jobs,
                            concurrency or self.cfg.concurrency, desc=desc,
                            on_result=(lambda r: on_result(*r)) if on_result else None,
                            progress=self.cfg.progress, score=lambda r: r[1].record.reward,
                            status=lambda r: r[1].record.status)
    return [outcome for _, outcome in done]

  def push(self, model, version: int) -> int:
    """New weights to the engine, as policy `version` (a remote engine takes any: also the one it
    holds, or a lower one); returns it. Raises PolicyUpdateError, naming the engine and the version, when the engine
    refuses them or its /model_info then reports another version or none (an engine that does not
    honour SGLang's weight_version). Calls in flight finish on the old weights or are aborted and
    retried (`cfg.engine.push_mode`)."""
    if self.engine is not None:
      got = self.engine.update_from_model(model, version)
      if got != version:
        raise PolicyUpdateError(f"embedded engine reports weight version {got} after the push of version {version}")
    else:
      # pylint: disable=import-outside-toplevel  (JAX)
      from clawjax import distributed
      from clawjax.models import hf_io
      out = self._export_root / f"version_{version}"
      # In a multi-process run every process writes its share of the tensors; in the dtype the policy
      # computes with (bf16 over f32 master weights: half the bytes, the same forward).
      hf_io.save(model, out, dtype=hf_io.push_dtype(model.cfg))
      problem = None
      if distributed.is_primary():  # the engines are the run's, not a process's: one process updates them
        try:
          # Every live replica holds the new weights before any rollout. One that is down is passed over:
          # its rollouts fail meanwhile, and calls it answers with old weights if it comes back are
          # stale (batch.max_staleness drops them).
          if not sum(self._update(target, str(out), version) for target in self._update_targets):
            raise PolicyUpdateError(f"no engine took weight version {version}: {self._targets_named()}")
        except PolicyUpdateError as e:
          problem = str(e)
      problems = [p for p in distributed.allgather_json(problem) if p]
      if problems:
        raise PolicyUpdateError(problems[0])
    self.version = version
    return version

  def _targets_named(self) -> str:
    return ", ".join(str(getattr(t, "url", self.cfg.engine.url)) for t in self._update_targets)

  def _update(self, target: Backend, path: str, version: int) -> bool:
    """Whether `target` took the weights; False for a replica that is down (one of several)."""
    where = f"engine {self.cfg.engine.backend} at {getattr(target, 'url', self.cfg.engine.url)}"
    try:
      # The update leaves no prefix cached under the old weights (SGLang's flushes inside it, while new
      # requests are held): no flush of its own, which would meet the held requests running again.
      abort = self.cfg.engine.push_mode == "abort"
      got = self.shim.run(target.update_weights_from_disk(path, version, abort=abort))
    except BackendError as e:
      if e.overloaded and len(self._update_targets) > 1:
        log.warning("%s is down (%s): weight version %d not pushed to it", where, e, version)
        return False
      raise PolicyUpdateError(f"{where} refused weight version {version} ({path}): {e}") from e
    except Exception as e:  # pylint: disable=broad-except  (any refusal ends the run, named)
      raise PolicyUpdateError(f"{where} refused weight version {version} ({path}): {type(e).__name__}: {e}") from e
    if got != version:
      # None: the engine ignored the version (SGLang reports "default" before it honours one); its calls
      # would carry no version, and batch.max_staleness could not bound them.
      reported = "no weight version" if got is None else f"weight version {got}"
      raise PolicyUpdateError(f"{where} reports {reported} after the push of version {version} ({path})")
    return True
