"""Learning: configs/sft/cpu_small.py (a toy model from scratch, the 30 bundled synthetic tool-call
trajectories in mini's shape) cuts the held-out loss by far more than 80%; then its export, served by the
embedded engine behind the shim and sampled greedily by the real `mini` harness, makes the demonstrated
tool call on held-out tasks of the family (file and word pairs it never saw together), and the tasks'
own checkers score them."""
from __future__ import annotations

import json
import pathlib

import pytest

from clawjax import config as config_lib
from clawjax.calllog import load
from clawjax.evaluation.config import eval_config
from clawjax.evaluation.runner import run_eval
from clawjax.sft.config import sft_config
from clawjax.sft.stage import run_stage
from clawjax.text.templates import load_template
from clawjax.train.metrics import MetricsWriter, read_metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
TASKS = ROOT / "clawjax" / "data" / "sft" / "tasks"


@pytest.mark.slow
def test_the_cpu_config_learns_the_family_and_solves_held_out_tasks(tmp_path):
  config = config_lib.config_module(str(ROOT / "configs" / "sft" / "x.py"), "cpu_small.py").get_config()
  cfg = sft_config(config, ["progress=False", "tensorboard=False"])
  metrics = MetricsWriter(tmp_path / "sft", tensorboard=False)
  try:
    summary = run_stage(cfg, tmp_path / "sft", metrics)
  finally:
    metrics.close()
  rows = read_metrics(tmp_path / "sft", "sft")
  first, last = rows[0]["heldout_nll"], rows[-1]["heldout_nll"]
  assert rows[0]["step"] == 0 and rows[-1]["step"] == summary["updates"]
  assert last <= 0.2 * first, (first, last)

  run = run_eval(eval_config({
      "tasks": str(TASKS), "harness": "mini", "benchmark": "sft-family", "concurrency": 2, "progress": False,
      "model": {"init": summary["export_dir"]},
      "engine": {"backend": "embedded", "options": {"max_slots": 2, "max_seq_len": 1024}},
      "shim": {"temperature": 0.0, "max_new_tokens": 64, "max_context": 1024},
      "rollout": {"timeout_s": 300.0, "settle_interval_s": 0.05, "settle_checks": 2, "harness": {"max_turns": 2},
                  "work_root": str(tmp_path / "work")}}), tmp_path / "eval")
  template = load_template(summary["export_dir"])
  calls = load(tmp_path / "eval" / "calls").calls
  solved = 0
  for result in run.results:
    entry = json.loads((TASKS / result.task_id / "data_entry.json").read_text())
    file, word = entry["user_query"].split('"')[1::2]
    first_call = calls[result.rollout_id][0]
    turn = template.parse(list(first_call.output_ids))
    made = [(c.name, c.arguments) for c in turn.tool_calls]
    solved += made == [("write", {"path": file, "content": word})]
    assert result.final_score == (1.0 if made == [("write", {"path": file, "content": word})] else 0.0)
  assert solved == len(run.results) == 6
