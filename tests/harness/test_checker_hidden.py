"""The checker is invisible to the agent while it runs: a test agent searches the file system for it.

The agent is the mini harness driven by the scripted backend; its one tool call is a shell command that
reads the task's checker at its absolute host path (the strongest attacker: it knows where the task
came from) and, in the sandbox, also scans by name and by content. Whatever it finds comes back as the
tool result, i.e. into the next call's input in the log. Two task locations: a task directory
elsewhere on disk, and one bundled in clawjax/data, inside the package the sandbox must show (to run
Python tools). The direct read without the sandbox is the control: there it must find the checker, or
the test could not fail.
"""

import contextlib
import json
import pathlib
import secrets
import textwrap

import pytest

import clawjax
from clawjax.harness import sandbox
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn
from clawjax.tasks import load_task_dir

from tests.harness.helpers import decode_input, dumps, load_rollout, start_shim

BUNDLED = pathlib.Path(clawjax.__file__).parent / "data" / "tasks" / "toy_hello_py"


def _task_dir(root, sentinel):
  d = root / "task_9001_hidden"
  (d / "input_files").mkdir(parents=True)
  (d / "reward").mkdir()
  (d / "data_entry.json").write_text(json.dumps({
      "task_id": "task_9001_hidden", "user_query": "Create hello.txt containing hello.",
      "input_mount_dir": "/root/.openclaw/workspace",
      "metadata": {"category": "files", "grading_type": "automated"}}))
  (d / "input_files" / "notes.txt").write_text("nothing to see\n")
  (d / "reward" / "check.py").write_text(textwrap.dedent(f"""\
      # {sentinel}
      import json, pathlib, sys
      print(json.dumps({{"exists": float((pathlib.Path(sys.argv[1]) / "hello.txt").is_file())}}))
      """))
  (d / "reward" / "reward.sh").write_text(
      "#!/usr/bin/env bash\npython3 reward/check.py \"$PWD\" | python3 -c "
      "'import json,sys; d=json.load(sys.stdin); print(sum(d.values())/len(d))'\n")
  return d


def _search(task_dir, secret, scan: bool) -> str:
  """Reads the checker at its known host path; with `scan`, also searches by name and content."""
  cmd = f"cat {task_dir}/reward/check.py; ls -R {task_dir.parent}; "
  if scan:
    prune = " -o ".join(f"-path {p}" for p in ("/proc", "/sys", "/dev", "/usr", "'*/site-packages'"))
    cmd += (f"find / -maxdepth 7 \\( {prune} \\) -prune -o \\( -path '*/reward/check.py' -o "
            f"-name reward.sh \\) -print; "
            # .mini: the agent's own transcript, which holds this very command
            f"grep -rlF --exclude-dir=.mini --exclude-dir=site-packages '{secret}' "
            "/tmp /root /home /run /work \"$HOME\" . ; ")
  return cmd + "echo search-done"


# The control ("none") skips the file-system scan: on the host it would walk this machine's caches.
@pytest.mark.parametrize("where", ["elsewhere", "bundled"])
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_agent_searching_for_the_checker_finds_nothing(mode, where, template, tmp_path):
  if mode == "bwrap" and sandbox.bwrap_problem():
    pytest.skip(f"bubblewrap unusable: {sandbox.bwrap_problem()}")
  if where == "bundled":
    task_dir = BUNDLED
    secret = max((BUNDLED / "reward" / "check.py").read_text().splitlines(), key=len).strip()
  else:
    secret = f"CHECKER-{secrets.token_hex(8)}"
    task_dir = _task_dir(tmp_path / "tasks", secret)
  task = load_task_dir(task_dir)
  script = [ScriptTurn(text="Looking around.", tool_calls=(
                ("bash", {"command": _search(task_dir, secret, scan=mode == "bwrap")}),)),
            ScriptTurn(text="Nothing found.")]
  with contextlib.ExitStack() as stack:
    shim = start_shim(stack, template, tmp_path / "logs", script)
    config = RolloutConfig(timeout_s=120, settle_interval_s=0.1, work_root=str(tmp_path / "work"),
                           sandbox=sandbox.SandboxConfig(mode=mode))
    outcome = run_rollout(shim.url, task, "mini", config, admin_token=shim.admin_token)
  calls, _, _ = load_rollout(tmp_path / "logs", outcome.record.rollout_id)
  assert len(calls) == 2 and outcome.record.status == "ok", dumps(outcome.record.extra)
  # The search's output as the model saw it: the tool response in the next call's input.
  tool_result = decode_input(template, calls[1].input_ids).rsplit("<tool_response>", 1)[1]
  assert "search-done" in tool_result  # the search ran and its output reached the model
  if mode == "bwrap":
    assert secret not in tool_result, tool_result[-3000:]
    assert not [l for l in tool_result.splitlines() if l.endswith(("/reward/check.py", "/reward.sh"))]
  else:  # the control: without isolation the direct read finds the checker
    assert secret in tool_result
