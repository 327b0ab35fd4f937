"""The run report on a training run directory laid out as the trainer lays it out (metrics.jsonl written by
the trainer's MetricsWriter, rollout records and call logs of two steps, config.json), checked in a real
headless browser: no console errors or network, one chart per metric group the run has, failures by
reason with the harness's stderr, best and worst rollouts by reward, each link opening its tree."""

import json
import pathlib

import numpy as np

from clawjax import calllog
from clawjax.calllog import CallLogWriter, RolloutRecord
from clawjax.report.charts import CHARTS, read_metrics, series
from clawjax.train.metrics import MetricsWriter
from clawjax.tree import synthetic
from experiments import report as report_cli

from tests.browser import open_page

STDERR = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'yaml'\n"


def make_run(workdir: pathlib.Path, steps: int = 2, per_step: int = 5) -> dict[str, float]:
  """A training run's files for `steps` steps; returns the last step's rewards by rollout id."""
  rng = np.random.default_rng(0)
  (workdir / "calls").mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps({"model": {"init": "test-tiny", "template": None},
                                                   "harnesses": ["mini"], "seed": 0}))
  metrics = MetricsWriter(workdir, tensorboard=False)
  metrics.write("sft", 1, {"nll": 2.0})
  rewards: dict[str, float] = {}
  for step in range(1, steps + 1):
    step_dir = workdir / "steps" / f"step_{step}"
    step_dir.mkdir(parents=True)
    rewards = {}
    with CallLogWriter(step_dir / "rollouts.jsonl") as records:
      for k in range(per_step):
        rid = f"s{step}-task-mini-{k}"
        if k == per_step - 1:  # a harness that died in its sandbox
          records.write(RolloutRecord(rid, "task", "mini", None, "failed", {
              "reason": "the harness made no model call (exit 1)", "exit_code": 1, "stderr_tail": STDERR}))
          continue
        calls = synthetic.agent_rollout(rng, rollout_id=rid, task_id="task", harness="mini", prompt_len=40,
                                        n_calls=3, tokens_per_call=20, patterns=("retry",) if k == 0 else ())
        with CallLogWriter(workdir / "calls" / f"{rid}.jsonl") as log:
          for c in calls:
            log.write(c)
        rewards[rid] = round(float(rng.uniform()), 3)
        records.write(RolloutRecord(rid, "task", "mini", rewards[rid], "ok",
                                    {"n_calls": len(calls), "wall_s": 1.0 + k,
                                     "score": {"code_score": rewards[rid], "rubric_score": None,
                                               "final_score": rewards[rid]}}))
    metrics.write("rl", step, {"reward/mean": float(np.mean(list(rewards.values()))), "reward_harness/mini/mean": 0.5,
                               "reward_group/task/mini/mean": 0.5, "count/calls_train": 9.0, "count/calls_retry": 1.0,
                               "count/status_failed": 1.0, "over_branching_rate": 0.0, "drift_calls": 0.0,
                               "tis_truncated_fraction": 0.01, "clip_fraction": 0.1, "entropy": 3.0,
                               "approx_kl": 0.001, "grad_norm": 0.5, "tokens_per_s": 100.0, "rollout_s": 10.0,
                               "learner_s": 2.0, "push_s": 0.1})
  metrics.close()
  return rewards


def test_report_of_a_training_run_in_a_headless_browser(tmp_path):
  workdir = tmp_path / "run"
  rewards = make_run(workdir)
  assert report_cli.main(["--workdir", str(workdir)]) == 0
  rows = read_metrics(workdir)
  expected_charts = [c.title for c in CHARTS if series(rows, c)]
  assert "TIS truncation" in expected_charts and "cold-start SFT loss" in expected_charts
  best = sorted(rewards, key=lambda r: -rewards[r])
  with open_page(workdir / "report.html") as (page, errors):
    assert page.eval_on_selector_all("figure.chart", "e => e.map(f => f.dataset.title)") == expected_charts
    assert page.eval_on_selector_all("figure.chart svg", "e => e.length") == len(expected_charts)
    assert page.inner_text("#failures").count("ModuleNotFoundError: No module named 'yaml'") == 1
    assert "the harness made no model call (exit 1)" in page.inner_text("#failures")
    listed = lambda table: page.eval_on_selector_all(f"#{table} a", "e => e.map(a => a.textContent)")
    assert listed("best") == best[:3] and listed("worst") == best[::-1][:3]
    assert "test-tiny" in page.inner_text("body")  # the config
    page.click("#worst a")  # the worst rollout's tree
    page.wait_for_selector("#tree svg")
    assert page.inner_text("#head h2") == best[-1]
    calls = calllog.load(workdir / "calls" / f"{best[-1]}.jsonl").calls[best[-1]]
    page.click("svg g.node[data-node='0'] rect")
    assert page.eval_on_selector_all("#tokens span", "e => e.length") > 0
    assert page.eval_on_selector_all("svg g.node", "e => e.length") >= len(calls)
    assert errors == []


def test_report_of_an_evaluation_run(tmp_path):
  """run_eval ends with the report: the evaluation summary, and the best rollout's tree with its tokens
  decoded by the run's own tokenizer (the real mini harness and checkers; a scripted policy)."""
  from clawjax.evaluation.runner import run_eval
  from clawjax.serving.backends.scripted import ScriptedBackend
  from clawjax.text.templates import load_template
  from tests.evaluation.test_eval_run import _config, _solver

  template = load_template("qwen3")
  workdir = tmp_path / "eval"
  run = run_eval(_config(tmp_path, task_ids=["toy_sum_numbers", "toy_rename_file"]), workdir,
                 backend=ScriptedBackend(template, _solver(template)))
  summary = json.loads((workdir / "summary.json").read_text())
  best = max(run.results, key=lambda r: r.final_score)
  with open_page(workdir / "report.html") as (page, errors):
    overall = page.eval_on_selector_all("#evaluation tr", "e => e.map(r => r.innerText)")[-1]
    assert overall.split("\t")[0] == "all" and overall.split("\t")[-1] == f"{summary['overall']['score']:.3f}"
    assert page.inner_text("#best a").split("\n")[0] == best.rollout_id
    page.click("#best a")
    page.wait_for_selector("#tree svg")
    assert page.inner_text("#head h2") == best.rollout_id
    outputs = page.eval_on_selector_all(  # the nodes the policy sampled
        "svg g.node", "e => e.filter(g => g.textContent.includes('out')).map(g => g.dataset.node)")
    texts = []
    for node in outputs:
      page.click(f"svg g.node[data-node='{node}'] rect")
      texts.append("".join(page.eval_on_selector_all("#tokens span", "e => e.map(s => s.textContent)")))
    assert any("answer.txt" in t for t in texts) and any("Done." in t for t in texts), texts
    assert errors == []


def test_tree_cli_on_a_run_directory(tmp_path, capsys):
  """`python -m clawjax.tree view STEP/rollouts.jsonl --workdir RUN --rollout ID --tokenizer FILE`: the
  rollout's calls come from RUN/calls, its advantage from the step's advantages.json, text from the file."""
  from clawjax.text.tokenizer import load_tokenizer
  from clawjax.tree.__main__ import main as tree_main

  workdir = tmp_path / "run"
  rewards = make_run(workdir)
  rid = max(rewards, key=rewards.get)
  (workdir / "steps" / "step_2" / "advantages.json").write_text(json.dumps({rid: 1.25}))
  tokenizer = load_tokenizer("qwen3")
  tokenizer.hf.save(str(tmp_path / "tokenizer.json"))
  out = tmp_path / "one.html"
  assert tree_main(["view", str(workdir / "steps" / "step_2" / "rollouts.jsonl"), "--workdir", str(workdir),
                    "--rollout", rid, "--tokenizer", str(tmp_path / "tokenizer.json"), "--out", str(out)]) == 0
  assert capsys.readouterr().out.strip() == f"{out}: 1 rollouts"
  with open_page(out) as (page, errors):
    assert page.inner_text("#head h2") == rid
    assert "1.250" in page.inner_text("#header")  # the advantage
    kept = page.get_attribute("svg g.node[data-kept='1'] >> nth=-1", "data-node")
    page.click(f"svg g.node[data-node='{kept}'] rect")
    ids = page.eval_on_selector_all("#tokens span", "e => e.map(s => +s.dataset.id)")
    texts = page.eval_on_selector_all("#tokens span", "e => e.map(s => s.textContent)")
    assert texts == [tokenizer.decode([i]) for i in ids]
    assert errors == []
  assert tree_main(["view", str(workdir / "calls"), "--rollout", "nope", "--out", str(out)]) == 1
  assert "rollouts ['nope'] are in none of" in capsys.readouterr().err
