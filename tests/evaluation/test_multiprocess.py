"""experiments/eval.py on two processes of this machine as two hosts (JAX's multi-controller runtime, CPU):
the processes split the tasks (task i on process i mod 2, all its samples), each writes files of its own,
and process 0 merges one results.jsonl and writes the summary once; rerunning the commands resumes, each
process redoing only its own missing rollouts."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from clawjax.calllog import RolloutRecord, iter_records
from clawjax.tasks import bundled_tasks_dir, select_tasks
from tests.evaluation.test_cli import CONFIG
from tests.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASKS = ("toy_sum_numbers", "toy_fix_typo", "toy_hello_py")
ORDER = [t.task_id for t in select_tasks(str(bundled_tasks_dir()), TASKS)]  # the tasks' selection order


def _eval(tmp_path: pathlib.Path, workdir: pathlib.Path) -> list[str]:
  """Both processes' stdout."""
  port = free_port()
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen(
      [sys.executable, "experiments/eval.py", f"--config={tmp_path / 'cfg.py'}",
       f"--config.tasks={bundled_tasks_dir()}", f"--config.task_ids={','.join(TASKS)}",
       "--config.num_samples=2", "--config.distributed.num_processes=2",
       f"--config.distributed.process_id={i}", f"--config.distributed.coordinator=127.0.0.1:{port}",
       f"--workdir={workdir}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
  return [out for out, _ in outs]


def _records(path: pathlib.Path) -> list[RolloutRecord]:
  return [r for r in iter_records(path) if isinstance(r, RolloutRecord)]


@pytest.mark.slow
def test_two_processes_split_the_tasks_and_write_one_results_file(tmp_path):
  script = tmp_path / "turns.json"  # a write and a final answer, whatever the task
  script.write_text(json.dumps([
      {"tool_calls": [{"name": "write", "arguments": {"path": "answer.txt", "content": "41"}}]},
      {"text": "Done."}]))
  (tmp_path / "cfg.py").write_text(CONFIG.format(script=str(script)))
  workdir = tmp_path / "run"
  stdout = _eval(tmp_path, workdir)
  assert "| mini | scripted |" in stdout[0] and "| mini |" not in stdout[1]  # the summary printed once

  results = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
  assert [(r["task_id"], r["sample"]) for r in results] == [(t, s) for t in ORDER for s in (0, 1)]
  assert {r["status"] for r in results} == {"ok"}
  assert not list(workdir.glob("results.process_*.jsonl"))  # merged into results.jsonl
  for i in (0, 1):
    records = _records(workdir / f"rollouts.process_{i}.jsonl")
    assert {r.extra["process_index"] for r in records} == {i}
    assert sorted(r.task_id for r in records) == sorted(2 * ORDER[i::2])  # task k on process k mod 2
    assert all((workdir / "calls" / f"process_{i}" / f"{r.rollout_id}.jsonl").exists() for r in records)
  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["num_processes"] == 2
  assert ORDER[1] in (workdir / "report.html").read_text()  # process 1's rollouts in the report

  # Lose process 1's last result: the rerun redoes that rollout only, on process 1.
  lines = (workdir / "results.jsonl").read_text().splitlines()
  (workdir / "results.jsonl").write_text("\n".join(lines[:3] + lines[4:]) + "\n")
  before = [len(_records(workdir / f"rollouts.process_{i}.jsonl")) for i in (0, 1)]
  _eval(tmp_path, workdir)
  assert [len(_records(workdir / f"rollouts.process_{i}.jsonl")) for i in (0, 1)] == [before[0], before[1] + 1]
  again = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
  assert [(r["task_id"], r["sample"]) for r in again] == [(t, s) for t in ORDER for s in (0, 1)]
