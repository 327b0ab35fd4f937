"""Rollout statuses and the concurrent runner, with the mini harness on the real shim."""

import json

from clawjax import calllog
from clawjax.calllog import CallLogWriter
from clawjax.harness.__main__ import main
from clawjax.harness.adapters import HarnessOptions
from clawjax.harness.rollout import RolloutConfig, run_rollout, run_rollouts
from clawjax.serving.backends.scripted import ScriptTurn

from tests.harness.helpers import CHECKER, decode_input, dumps, load_rollout
from tests.ports import free_port

WRITE = ScriptTurn(text="", tool_calls=(("write", {"path": "hello.txt", "content": "hello"}),))
FINAL = ScriptTurn(text="Done.")


def _config(tmp_path, **kw):
  return RolloutConfig(settle_interval_s=0.05, settle_checks=2, work_root=str(tmp_path / "work"),
                       **{"timeout_s": 60, **kw})


def test_concurrent_rollouts_each_get_their_own_log(make_shim, template, hello_task, tmp_path):
  # The script depends on the prompt, not on arrival order: concurrent rollouts interleave.
  def play(ids):
    return FINAL if "<tool_response>" in decode_input(template, ids) else WRITE

  shim = make_shim(play)
  with CallLogWriter(tmp_path / "logs" / "rollouts.jsonl") as writer:
    outcomes = run_rollouts(shim.url, [(hello_task, "mini")] * 3, _config(tmp_path), writer,
                            concurrency=3, admin_token=shim.admin_token)
  assert len({o.record.rollout_id for o in outcomes}) == 3
  for o in outcomes:
    assert (o.record.status, o.record.reward) == ("ok", 1.0), dumps(o.record.extra)
    calls, logged, tree = load_rollout(tmp_path / "logs", o.record.rollout_id)
    assert logged == o.record
    assert len(calls) == 2 and [tree.reasons[i] for i in range(2)] == ["train", "train"]
    assert o.rollout_dir is None and not list((tmp_path / "work" / "clawjax-rollouts").glob(
        f"*/{o.record.rollout_id}"))  # removed (keep_dirs=False)


def test_harness_past_its_timeout_is_killed_and_marked(make_shim, hello_task, tmp_path):
  shim = make_shim([ScriptTurn(text="", tool_calls=(("bash", {"command": "sleep 120"}),)), FINAL])
  outcome = run_rollout(shim.url, hello_task, "mini", _config(tmp_path, timeout_s=3),
                        admin_token=shim.admin_token)
  rec = outcome.record
  assert (rec.status, rec.reward) == ("timeout", None), dumps(rec.extra)
  assert rec.extra["harness_wall_s"] < 30


def test_unreachable_shim_marks_the_rollout_failed(hello_task, tmp_path):
  port = free_port()
  with CallLogWriter(tmp_path / "rollouts.jsonl") as writer:
    outcome = run_rollout(f"http://127.0.0.1:{port}", hello_task, "mini",
                          _config(tmp_path, http_timeout_s=5), writer)
  assert (outcome.record.status, outcome.record.reward) == ("failed", None)
  assert "POST /rollouts" in outcome.record.extra["reason"]


def test_harness_giving_up_on_a_dead_backend_is_failed(make_shim, hello_task, tmp_path):
  shim = make_shim([FINAL], failures={i: 500 for i in range(10)})
  config = _config(tmp_path, harness=HarnessOptions(
      mini_args=("--http-retries", "2", "--http-backoff-s", "0.01")))
  outcome = run_rollout(shim.url, hello_task, "mini", config, admin_token=shim.admin_token)
  rec = outcome.record
  assert rec.status == "failed" and rec.extra["exit_code"] == 1, dumps(rec.extra)
  calls, _, _ = load_rollout(tmp_path / "logs", rec.rollout_id)
  assert [c.status for c in calls] == ["error"] * 3


def test_cli_runs_every_task_and_skips_broken_ones(make_shim, template, tmp_path, capsys, monkeypatch):
  def play(ids):
    return FINAL if "<tool_response>" in decode_input(template, ids) else WRITE

  tasks = tmp_path / "tasks.jsonl"
  good = {"task_id": "hello", "prompt": "Create hello.txt containing hello.",
          "hook_code": "python3 reward/test.py /root/.openclaw/workspace",
          "input_files": [{"file_path": "reward/test.py", "content": CHECKER}]}
  tasks.write_text(json.dumps(good) + "\n" + json.dumps({"task_id": "broken"}) + "\n")
  shim = make_shim(play)
  out = tmp_path / "logs" / "rollouts.jsonl"
  monkeypatch.delenv("CLAWJAX_ADMIN_TOKEN", raising=False)
  token_file = tmp_path / "admin_token"
  token_file.write_text(shim.admin_token + "\n")
  assert main(["--shim", shim.url, "--tasks", str(tasks), "--harness", "mini", "--out", str(out),
               "--n", "2", "--work-root", str(tmp_path / "work"), "--admin-token-file", str(token_file)]) == 0
  assert "task 'broken'" in capsys.readouterr().err
  log = calllog.load(tmp_path / "logs")
  assert sorted((r.task_id, r.status, r.reward) for r in log.rollouts.values()) == [
      ("hello", "ok", 1.0)] * 2
  assert all(len(log.calls[rid]) == 2 for rid in log.rollouts)
