"""Results files written by hand (raw JSON lines, not through the code under test)."""

import json
import pathlib


def result_line(task_id, category, status="ok", final=None, code=None, sample=0, harness="openclaw"):
  return {"schema": "clawjax.eval/1", "task_id": task_id, "sample": sample, "category": category,
          "harness": harness, "status": status, "code_score": code, "rubric_score": None,
          "final_score": final, "rollout_id": f"{task_id}-s{sample}", "calls": 3,
          "input_tokens": 100, "output_tokens": 20, "wall_s": 1.5, "error": None, "metrics": {},
          "rollout_dir": None}


def write_run(workdir, lines, benchmark="ClawGym-Bench", harness="openclaw", model="Qwen3-30A3B",
              unscored="zero", tail="", **info):
  """A run directory; `info` adds run.json fields (seed, trained_in)."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "run.json").write_text(json.dumps({
      "benchmark": benchmark, "harness": harness, "model_label": model, "tasks": "tasks/",
      "unscored": unscored, **info}))
  (workdir / "results.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines) + tail)
  return workdir
