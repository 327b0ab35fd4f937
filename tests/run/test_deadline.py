"""A GRPO group's deadline in a synchronous step (`PolicySession.run` with `group_deadline_s`, what the
synchronous training loop runs; the asynchronous loop's is in tests/train/test_async.py): a group whose
rollouts hang is given up at its deadline, each of its rollouts recorded as overdue in place of its own
record (which, coming later, is dropped), and the step's data leaves that group out whole and trains the
others. The real shim, mini harness and checker; a scripted policy stands for the model."""
from __future__ import annotations

import dataclasses
import time

import pytest

from clawjax.calllog import CallLogWriter, RolloutRecord, iter_records
from clawjax.harness import adapters
from clawjax.run.session import PolicySession, RolloutJob, chat_template
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.tasks import select_tasks
from clawjax.train.config import train_config
from clawjax.train.layout import RunLayout
from clawjax.train.step_data import build_step
from clawjax.tree.filters import FilterConfig

from tests.train.test_e2e import _task_dir

DEADLINE_S = 6.0


class Hang(adapters.Mini):
  """Runs past its group's deadline (its own timeout ends it 4 s later)."""
  name = "hang"

  def command(self, base_url, api_key, prompt, home, options):
    return adapters.HarnessCommand(["sleep", "25"], {}, [])


@pytest.mark.slow  # the deadline, then the hung rollouts' own timeout (about 25 s in all)
def test_a_hung_group_is_given_up_at_its_deadline_and_the_step_trains_the_others(tmp_path, monkeypatch):
  monkeypatch.setitem(adapters.ADAPTERS, "hang", Hang())
  tasks = _task_dir(tmp_path)
  cfg = train_config({
      "tasks": str(tasks), "harnesses": ("mini", "hang"), "tensorboard": False, "progress": False,
      "model": {"init": "smollm2-135m", "template": "smollm2"},
      "rollout": {"timeout_s": 10.0, "settle_interval_s": 0.05, "settle_checks": 2, "harness": {"max_turns": 1}}})
  (task,) = select_tasks(tasks)
  jobs = [RolloutJob(task, harness, k, group=g) for g, harness in enumerate(("mini", "hang")) for k in range(2)]
  layout = RunLayout(tmp_path / "run")
  path = layout.workdir / "rollouts.jsonl"
  backend = ScriptedBackend(chat_template(cfg.model), [ScriptTurn(text="Done.")])
  with PolicySession(cfg, layout.calls_dir, backend=backend) as session, CallLogWriter(path) as writer:
    t0 = time.monotonic()
    session.run(jobs, writer, label="s1", group_deadline_s=DEADLINE_S)
    took = time.monotonic() - t0
    time.sleep(9)  # past the hung rollouts' own 10 s timeout: their records come, and must be dropped
  assert DEADLINE_S <= took < DEADLINE_S + 5, took
  records = [r for r in iter_records(path) if isinstance(r, RolloutRecord)]
  assert sorted((r.harness, r.status, bool(r.extra.get("overdue"))) for r in records) == [
      ("hang", "timeout", True), ("hang", "timeout", True), ("mini", "ok", False), ("mini", "ok", False)]
  overdue = [r for r in records if r.extra.get("overdue")]
  assert all(r.extra["group"] == 1 and "passed its deadline of 6 s" in r.extra["reason"] for r in overdue)
  assert all((layout.calls_dir / f"{r.rollout_id}.jsonl").exists() for r in overdue)  # its shim log, same id
  data = build_step(layout.load(path), policy_version=0, vocab_size=backend.template.tokenizer.vocab_size,
                    filters=FilterConfig(), batch=dataclasses.replace(cfg.batch, row_len=4096, rows=2))
  assert (data.counts["overdue"], data.counts["overdue_groups"], data.tree_stats["trained_rollouts"]) == (2, 1, 2)
