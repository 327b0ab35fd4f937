"""experiments/eval.py as a command (flags -> config -> run -> summary), then experiments/tables.py."""

import json
import os
import pathlib
import subprocess
import sys

from clawjax.tasks import bundled_tasks_dir
from experiments import tables

REPO = pathlib.Path(__file__).resolve().parents[2]

CONFIG = '''
from ml_collections import config_dict

def get_config():
  c = config_dict.ConfigDict()
  c.tasks = config_dict.placeholder(str)
  c.harness = "mini"
  c.benchmark = "toy"
  c.model_label = "scripted"
  c.task_ids = ("toy_sum_numbers",)
  c.progress = False
  c.model = config_dict.ConfigDict({{"init": "qwen3"}})
  c.engine = config_dict.ConfigDict({{"backend": "scripted", "options": {{"script": {script!r}}}}})
  c.rollout = config_dict.ConfigDict({{"timeout_s": 60.0, "settle_interval_s": 0.05}})
  return c
'''


def test_eval_then_tables_commands(tmp_path, capsys):
  script = tmp_path / "turns.json"  # the model's two turns: solve, then answer
  script.write_text(json.dumps([
      {"tool_calls": [{"name": "write", "arguments": {"path": "answer.txt", "content": "41"}}]},
      {"text": "Done."}]))
  config = tmp_path / "cfg.py"
  config.write_text(CONFIG.format(script=str(script)))
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  out = subprocess.run(
      [sys.executable, "experiments/eval.py", f"--config={config}",
       f"--config.tasks={bundled_tasks_dir()}", f"--workdir={tmp_path / 'run'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "| mini | scripted |" in out.stdout and "100.00" in out.stdout, out.stdout
  [line] = (tmp_path / "run" / "results.jsonl").read_text().splitlines()
  assert json.loads(line)["final_score"] == 1.0

  tables.main(["--runs", str(tmp_path / "run"), "--out", str(tmp_path / "table")])
  assert "| OpenClaw | ClawII-OC-30A3B | - | 87.32 | - | - | 62.62 | - |" in capsys.readouterr().out
  env = json.loads((tmp_path / "run" / "environment.json").read_text())
  commit = env["clawjax"]["commit"][:10] + ("+dirty" if env["clawjax"]["dirty"] else "")
  # Both paper benchmarks empty, then toy and toy: data, then the run's commit and environment.
  assert (tmp_path / "table.csv").read_text().splitlines()[-1] == f"mini,scripted,,,,,,,100.00,1,100.00,{commit},A"
