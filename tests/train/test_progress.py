"""A short training run (the quickstart at toy size: cold-start SFT, two RL steps) with its output sent to a
file, as a cluster job logs it: line-oriented progress only (no carriage return), a phase line for each
start-up phase, the SFT and each step's learner update, each step's line with an ETA; the run ends with its
report, and each step's advantages are on disk for the tree viewer."""

import json
import os
import pathlib
import subprocess
import sys
import urllib.parse

import pytest

from clawjax import calllog
from clawjax.calllog import RolloutRecord, iter_records

from tests.browser import open_page

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_progress_lines_in_a_log_file(tmp_path):
  workdir = tmp_path / "run"
  log_file = tmp_path / "train.log"
  args = ["--config=configs/quickstart.py", f"--workdir={workdir}", "--config.steps=2", "--config.tasks_per_step=1",
          "--config.rollouts_per_task=2", "--config.concurrency=2", "--config.sft.steps=2",
          "--config.sft.demos_per_task=1", "--config.batch.rows=2", "--config.checkpoint_every=1",
          "--config.tensorboard=False", "--config.plot=False"]
  with open(log_file, "w") as out:
    proc = subprocess.run([sys.executable, "experiments/train.py", *args], cwd=REPO, stdout=out,
                          stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=1200)
  text = log_file.read_text()
  assert proc.returncode == 0, text[-4000:]
  assert "\r" not in text
  for phase in ("harness mini: install: done in", "model: load smollm2-135m: done in",
                "cold-start SFT (2 steps): done in", "engine: load the policy (embedded): done in",
                "shim: start: done in", "learner: build: done in",
                "step 1/2: learner update (", "step 2/2: learner update ("):
    assert phase in text, phase
  assert "step 1/2: 2/2 rollouts, mean score" in text  # the rollouts' progress, as lines
  step_lines = [l for l in text.splitlines() if "step 1/2: reward" in l or "step 2/2: reward" in l]
  assert len(step_lines) == 2 and "ETA " in step_lines[0] and ", ETA 0.0s" in step_lines[1]
  assert (workdir / "report.html").stat().st_size > 0
  for step in (1, 2):
    advantages = json.loads((workdir / "steps" / f"step_{step}" / "advantages.json").read_text())
    records = [r for r in iter_records(workdir / "steps" / f"step_{step}" / "rollouts.jsonl")
               if isinstance(r, RolloutRecord) and r.status == "ok"]
    assert sorted(advantages) == sorted(r.rollout_id for r in records)
    if len({r.reward for r in records}) == 2:  # a group of two with different rewards: A = +-1
      assert sorted(round(a, 4) for a in advantages.values()) == [-1.0, 1.0]
  # The last step's learner view: pi_old is the policy that sampled the step (a synchronous run), so the
  # learner's log-prob of every loss token matches the engine's to float32 rounding, and TIS weighs ~1.
  learner = json.loads((workdir / "steps" / "step_2" / "learner_tokens.json").read_text())
  assert learner["c_bar"] == 2.0 and learner["rollouts"]
  for rid, rows in learner["rollouts"].items():
    calls = {c.call_index: c for c in calllog.load(workdir / "calls" / f"{rid}.jsonl").calls[rid]}
    for call, depth, logp_old, w, truncated in rows:
      rollout_logp = calls[call].output_logprobs[depth - len(calls[call].input_ids)]
      assert abs(logp_old - rollout_logp) < 1e-3 and abs(w - 1.0) < 1e-2 and not truncated, (rid, call, depth)
  # The report's tree page shows them on the rollout's loss tokens.
  rid, rows = next(iter(learner["rollouts"].items()))
  with open_page(workdir / "report" / "step_2.html", f"#id={urllib.parse.quote(rid, safe='')}") as (page, errors):
    trained = page.eval_on_selector_all("svg g.node", "e => e.filter(g => g.dataset.kept === '1' && "
                                        "g.textContent.includes('out')).map(g => g.dataset.node)")
    page.click(f"svg g.node[data-node='{trained[0]}'] rect")
    cells = page.eval_on_selector_all("#tokentable tr", "e => e.slice(1).map(r => r.children[5].textContent)")
    assert cells and all(cells), cells  # a learner log-prob on every token of a trained output
    assert errors == []
