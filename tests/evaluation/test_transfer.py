"""The transfer matrix from real evaluation runs: the bundled toy tasks under three harnesses (the `mini`
harness, real OpenClaw and real Codex from npm, each in its sandbox, scored by the tasks' own checkers),
a scripted policy standing for the model: "base" answers without acting, "trained in mini" solves the
task with a shell command. Cells (the mean over tasks and its two-stage bootstrap interval over tasks and
seeds) and paired tests are checked against the runs' results files read here directly and an exact
sign-flip enumeration. Skipped only when npm (or its registry) is unreachable."""

import itertools
import json

import numpy as np
import pytest

from clawjax.evaluation.config import eval_config
from clawjax.evaluation.report import load_run, transfer_tables
from clawjax.evaluation.stats import task_bootstrap_interval
from clawjax.evaluation.runner import run_eval
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.tasks import bundled_tasks_dir
from clawjax.text.templates import load_template
from experiments import tables

from tests.harness.helpers import install_or_skip

pytestmark = [pytest.mark.harness, pytest.mark.slow]

TASKS = bundled_tasks_dir()
TASK_IDS = ("toy_sum_numbers", "toy_count_errors", "toy_fix_typo")
# Each harness's own shell tool and its argument.
SHELL = {"mini": ("bash", "command"), "openclaw": ("exec", "command"), "codex": ("exec_command", "cmd")}


def _policy(template, harness: str, trained: bool):
  numbers = (TASKS / "toy_sum_numbers" / "input_files" / "numbers.txt").read_text().split()
  commands = {"numbers.txt": f"echo {sum(map(int, numbers))} > answer.txt",
              "server.log": "grep -c ERROR server.log > errors.txt",
              "recieve": "sed -i s/recieve/receive/g notes.md"}

  def play(input_ids):
    prompt = template.tokenizer.decode(list(input_ids))
    if not trained or "<tool_response>" in prompt:
      return ScriptTurn(text="Done.")
    command = next(c for word, c in commands.items() if word in prompt)
    tool, argument = SHELL[harness]
    return ScriptTurn(text="", tool_calls=((tool, {argument: command}),))
  return play


def _run(tmp_path, harness, trained_in, seed):
  template = load_template("qwen3")
  config = eval_config({
      "tasks": str(TASKS), "harness": harness, "benchmark": "toy", "task_ids": TASK_IDS,
      "model_label": f"toy-{trained_in}", "seed": seed, "trained_in": trained_in, "concurrency": 3, "progress": False,
      "model": {"init": "qwen3"}, "engine": {"backend": "scripted"},
      "rollout": {"timeout_s": 200.0, "settle_interval_s": 0.05, "settle_checks": 2,
                  "work_root": str(tmp_path / "work"), "harness": {"max_turns": 4, "timeout_s": 180}}})
  workdir = tmp_path / f"{harness}-{trained_in}-{seed}"
  run_eval(config, workdir, backend=ScriptedBackend(template, _policy(template, harness, trained_in != "base")))
  return workdir


def _scores(workdir) -> dict[str, float]:
  """Task -> final score from results.jsonl as written (a rollout without one counts 0)."""
  lines = [json.loads(l) for l in (workdir / "results.jsonl").read_text().splitlines()]
  return {l["task_id"]: l["final_score"] or 0.0 for l in lines}


def _exact_p(a, b) -> float:
  d = np.array(a) - np.array(b)
  stats = [abs(np.mean(np.array(s) * d)) for s in itertools.product((1, -1), repeat=len(d))]
  return float(np.mean([s >= abs(d.mean()) - 1e-12 for s in stats]))


def test_transfer_matrix_from_eval_runs_under_three_harnesses(tmp_path, capsys):
  install_or_skip("openclaw")
  install_or_skip("codex")
  dirs = {("base", "mini", 0): _run(tmp_path, "mini", "base", 0),
          ("mini", "mini", 0): _run(tmp_path, "mini", "mini", 0),
          ("mini", "mini", 1): _run(tmp_path, "mini", "mini", 1),
          ("base", "openclaw", 0): _run(tmp_path, "openclaw", "base", 0),
          ("mini", "openclaw", 0): _run(tmp_path, "openclaw", "mini", 0),
          ("base", "codex", 0): _run(tmp_path, "codex", "base", 0),
          ("mini", "codex", 0): _run(tmp_path, "codex", "mini", 0)}
  scores = {k: _scores(d) for k, d in dirs.items()}
  for harness in ("openclaw", "codex"):
    assert scores[("mini", harness, 0)] == dict.fromkeys(TASK_IDS, 1.0), f"{harness} ran the policy's commands"
  untrained = next(v for k, v in scores.items() if k[0] == "base")
  assert all(v < 1.0 for v in untrained.values())

  ((bench, table),) = transfer_tables([load_run(d) for d in dirs.values()])
  assert bench == "toy"
  assert table.columns == ["trained in", "model", "Codex", "Codex vs base", "OpenClaw", "OpenClaw vs base",
                           "mini", "mini vs base"]
  rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
  assert [r[0] for r in table.rows] == ["base", "mini"]
  for trained_in in ("base", "mini"):
    for harness, column in (("mini", "mini"), ("openclaw", "OpenClaw"), ("codex", "Codex")):
      seeds = [s for (t, h, s) in scores if (t, h) == (trained_in, harness)]
      per_task = [[scores[(trained_in, harness, s)][t] for s in seeds] for t in TASK_IDS]
      mean = 100 * np.mean([np.mean(v) for v in per_task])
      lo, hi = task_bootstrap_interval(per_task)  # over the 3 tasks (and the seeds, where there are two)
      assert rows[trained_in][column] == (
          f"{mean:.2f} [{100 * lo:.2f}, {100 * hi:.2f}] n=3 tasks x {len(seeds)} seed{'s' * (len(seeds) > 1)}"
      ), rows[trained_in][column]
      assert 100 * min(map(min, per_task)) <= 100 * lo <= mean <= 100 * hi <= 100 * max(map(max, per_task))
      if trained_in == "base":
        assert rows["base"][f"{column} vs base"] is None
        continue
      mine = [np.mean([scores[(trained_in, harness, s)][t] for s in seeds]) for t in TASK_IDS]
      base = [scores[("base", harness, 0)][t] for t in TASK_IDS]
      delta = 100 * (np.mean(mine) - np.mean(base))
      assert rows[trained_in][f"{column} vs base"] == f"{delta:+.2f} (p={_exact_p(mine, base):.3g}, 3 tasks)"

  tables.main(["--transfer", "--runs", *map(str, dirs.values()), "--out", str(tmp_path / "transfer")])
  assert "## toy: trained in (rows) x evaluated in (columns)" in capsys.readouterr().out
  assert (tmp_path / "transfer.toy.csv").read_text().splitlines()[0] == ",".join(table.columns)
