"""End to end: experiments/eval.py's library path with the real shim, the real `mini` harness and the
bundled toy tasks' real checkers; a scripted policy stands for the model. Resuming runs only the rest."""

import json
import pathlib
import shutil
import subprocess

import pytest

from clawjax.evaluation.config import eval_config
from clawjax.evaluation.runner import EvalError, run_eval
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.tasks import bundled_tasks_dir, load_tasks
from clawjax.text.templates import load_template

TASKS = bundled_tasks_dir()
FINAL = ScriptTurn(text="Done.")


def _tool(name, **arguments):
  return ScriptTurn(text="", tool_calls=((name, arguments),))


def _solver(template):
  """One tool call per task, chosen from the task's own words in the prompt, then a final answer.
  Two are deliberately half-right, so scores other than 1 are checked too."""
  numbers = (TASKS / "toy_sum_numbers" / "input_files" / "numbers.txt").read_text().split()
  moves = {
      "numbers.txt": _tool("write", path="answer.txt", content=str(sum(map(int, numbers)))),
      "server.log": _tool("bash", command="grep -c ERROR server.log > errors.txt"),
      "recieve": _tool("edit", path="notes.md", old_text="recieve", new_text="receive"),
      "todo.txt": _tool("bash", command="cp todo.txt done.txt"),  # the old name stays: 2 of 3
      "hello.py": _tool("write", path="hello.py", content="print('Hello, world!')\n"),  # 2 of 3
  }

  def play(input_ids):
    prompt = template.tokenizer.decode(list(input_ids))
    if "<tool_response>" in prompt:
      return FINAL
    return next(turn for word, turn in moves.items() if word in prompt)
  return play


def _config(tmp_path, **overrides):
  return eval_config({
      "tasks": str(TASKS), "harness": "mini", "benchmark": "toy", "model_label": "scripted",
      "concurrency": 2, "progress": False,
      "model": {"init": "qwen3"}, "engine": {"backend": "scripted"},
      "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2,
                  "keep_dirs": True, "work_root": str(tmp_path / "work")},
      **overrides})


def _checker_says(task_id, rollout_dir):
  """The task's own reward.sh on a copy of the agent's final workspace."""
  workspace = next(p for p in pathlib.Path(rollout_dir).iterdir() if p.name.startswith(task_id))
  scratch = pathlib.Path(rollout_dir) / "reference"
  shutil.copytree(workspace, scratch)
  shutil.copytree(TASKS / task_id / "reward", scratch / "reward")
  out = subprocess.run(["bash", "reward/reward.sh"], cwd=scratch, capture_output=True, text=True,
                       check=True, timeout=60)
  return float(out.stdout.strip().splitlines()[-1])


def _rollout_records(workdir):
  return [json.loads(l) for l in (workdir / "rollouts.jsonl").read_text().splitlines()]


def test_eval_scores_match_checkers_and_resume_runs_only_the_rest(tmp_path):
  template = load_template("qwen3")
  workdir = tmp_path / "run"
  first = ["toy_sum_numbers", "toy_rename_file"]
  run_eval(_config(tmp_path, task_ids=first), workdir,
           backend=ScriptedBackend(template, _solver(template)))
  assert sorted(r["task_id"] for r in _rollout_records(workdir)) == sorted(first)

  # A resumed run over all five tasks runs only the three new ones.
  run = run_eval(_config(tmp_path), workdir, backend=ScriptedBackend(template, _solver(template)))
  records = _rollout_records(workdir)
  assert len(records) == 5 and len({r["task_id"] for r in records}) == 5
  tasks = {t.task_id: t for t in load_tasks(TASKS)}
  assert sorted(r.task_id for r in run.results) == sorted(tasks)
  for r in run.results:
    assert r.status == "ok", r
    assert r.final_score == pytest.approx(_checker_says(r.task_id, r.rollout_dir)), r
    assert r.code_score == r.final_score and r.category == tasks[r.task_id].category
    assert r.calls == 2 and r.output_tokens > 0 and r.input_tokens > r.output_tokens
  scores = {r.task_id: r.final_score for r in run.results}
  assert scores["toy_sum_numbers"] == 1.0 and scores["toy_rename_file"] == pytest.approx(2 / 3)

  summary = json.loads((workdir / "summary.json").read_text())
  assert summary["overall"]["score"] == pytest.approx(100 * sum(scores.values()) / 5)
  assert "| mini | scripted |" in (workdir / "summary.md").read_text()

  # A rollout last recorded as an infrastructure failure is redone; the others are not.
  failed = dict(json.loads((workdir / "results.jsonl").read_text().splitlines()[0]),
                status="failed", final_score=None)
  with open(workdir / "results.jsonl", "a") as fh:
    fh.write(json.dumps(failed) + "\n")
  run_eval(_config(tmp_path), workdir, backend=ScriptedBackend(template, _solver(template)))
  assert [r["task_id"] for r in _rollout_records(workdir)[5:]] == [failed["task_id"]]


def test_broken_tasks_and_crashing_rollouts_do_not_stop_the_run(tmp_path):
  tasks = tmp_path / "tasks"
  shutil.copytree(TASKS / "toy_sum_numbers", tasks / "toy_sum_numbers")
  (tasks / "broken").mkdir()
  (tasks / "broken" / "data_entry.json").write_text("{not json")
  template = load_template("qwen3")
  backend = ScriptedBackend(template, _solver(template))
  run = run_eval(_config(tmp_path, tasks=str(tasks)), tmp_path / "run", backend=backend)
  assert [(r.task_id, r.status, r.final_score) for r in run.results] == \
      [("toy_sum_numbers", "ok", 1.0)]
  # Rollouts that raise (their work root is a file) are recorded as failed, one by one.
  (tmp_path / "not_a_dir").write_text("")
  crash = _config(tmp_path, tasks=str(TASKS), rollout={"work_root": str(tmp_path / "not_a_dir")})
  run = run_eval(crash, tmp_path / "run2", backend=backend)
  assert len(run.results) == 5 and {r.status for r in run.results} == {"failed"}
  assert all("Error" in r.error for r in run.results), run.results[0].error


def test_connects_to_a_running_shim(tmp_path):
  template = load_template("qwen3")
  shim_config = ShimConfig(log_dir=str(tmp_path / "shim-logs"))
  token_file = tmp_path / "admin_token"
  with ShimThread(shim_config, ScriptedBackend(template, _solver(template)), template) as shim:
    without_token = run_eval(_config(tmp_path, task_ids=["toy_sum_numbers"], shim_url=shim.url), tmp_path / "r0")
    token_file.write_text(shim.admin_token + "\n")
    run = run_eval(_config(tmp_path, task_ids=["toy_sum_numbers"], shim_url=shim.url,
                           shim_token_file=str(token_file)), tmp_path / "run")
  assert "HTTP 401" in without_token.results[0].error  # the control routes need the shim's admin token
  assert [(r.status, r.final_score) for r in run.results] == [("ok", 1.0)]
  assert [p.stem for p in (tmp_path / "shim-logs").iterdir()] == [run.results[0].rollout_id]


def test_a_workdir_holds_one_run(tmp_path):
  template = load_template("qwen3")
  workdir = tmp_path / "run"
  backend = ScriptedBackend(template, _solver(template))
  run_eval(_config(tmp_path, task_ids=["toy_sum_numbers"]), workdir, backend=backend)
  with pytest.raises(EvalError, match=r"run.json: this directory holds another run \(harness"):
    run_eval(_config(tmp_path, harness="openclaw"), workdir, backend=backend)


def test_a_start_that_failed_leaves_the_workdir_to_the_corrected_command(tmp_path):
  template = load_template("qwen3")
  workdir = tmp_path / "run"
  backend = ScriptedBackend(template, _solver(template))
  with pytest.raises(EvalError, match="toy_sum_numbrs"):  # a mistyped task id: refused before any rollout
    run_eval(_config(tmp_path, task_ids=["toy_sum_numbrs"], model_label="policy-a"), workdir, backend=backend)
  run = run_eval(_config(tmp_path, task_ids=["toy_sum_numbers"], model_label="policy-b"), workdir, backend=backend)
  assert run.info.model_label == "policy-b" and [r.task_id for r in run.results] == ["toy_sum_numbers"]
