"""Run dirs: a run killed with kill -9 leaves its rollout and relay dirs; the next start removes exactly those
(never a live run's, a kept one's or a dir that is not a run's), and the new run uses dirs of its own."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from clawjax.harness import rundirs, sandbox

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A run that claims its dirs under each root given, puts a file in each, says so and stays alive.
HOLDER = """
import sys, time
from clawjax.harness import rundirs
run = rundirs.current_run()
for parent in sys.argv[1:]:
  (run.dir(parent) / "work.txt").write_text("x")
print(run.run_id, flush=True)
time.sleep(600)
"""

# A rollout with the mini harness on a scripted shim: the model asks for one bash command, then is done.
ROLLOUT = """
import os, sys
from clawjax.harness import rundirs
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.tasks import parse_jsonl_task
from clawjax.text.templates import load_template
from tests.harness.helpers import CHECKER
work, command = sys.argv[1], sys.argv[2]
template = load_template("qwen3")
task = parse_jsonl_task({"task_id": "hello", "prompt": "Create hello.txt containing the word hello.",
                         "hook_code": "python3 reward/test.py /root/.openclaw/workspace",
                         "input_files": [{"file_path": "reward/test.py", "content": CHECKER}]}, "test:hello")
turns = [ScriptTurn(text="", tool_calls=(("bash", {"command": command}),)), ScriptTurn(text="Done.")]
with ShimThread(ShimConfig(log_dir=f"{work}/logs-{os.getpid()}"), ScriptedBackend(template, turns),
                template) as shim:
  outcome = run_rollout(shim.url, task, "mini", RolloutConfig(timeout_s=600, settle_interval_s=0.1,
                                                              work_root=work), admin_token=shim.admin_token)
print(outcome.record.status, rundirs.current_run().run_id, flush=True)
"""


@pytest.fixture
def short_tmp(monkeypatch):
  """A short system temp dir for the runs here (relay socket paths must fit in 108 bytes)."""
  path = pathlib.Path(tempfile.mkdtemp(prefix="cj-", dir="/tmp"))
  monkeypatch.setattr(tempfile, "tempdir", str(path))
  yield path
  shutil.rmtree(path, ignore_errors=True)


def _env(tmp: pathlib.Path) -> dict[str, str]:
  return dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(
      [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _spawn(code: str, tmp: pathlib.Path, *args) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE, text=True,
                          env=_env(tmp), cwd=ROOT)


def _kill9(proc: subprocess.Popen) -> None:
  proc.send_signal(signal.SIGKILL)
  proc.wait(30)


def _owner_pid(run_dir: pathlib.Path) -> int:
  return json.loads((run_dir / rundirs.OWNER_LOCK).read_text())["pid"]


def test_killed_runs_dirs_are_removed_by_the_next_start_and_no_others(tmp_path, short_tmp):
  work = tmp_path / "work"
  roots = [rundirs.rollouts_root(work), rundirs.relays_root()]
  assert roots[1].parent == short_tmp
  killed, live = (_spawn(HOLDER, short_tmp, *roots) for _ in range(2))
  killed_id, live_id = killed.stdout.readline().strip(), live.stdout.readline().strip()
  try:
    assert killed_id and live_id and killed_id != live_id
    for root in roots:
      assert _owner_pid(root / killed_id) == killed.pid and (root / killed_id / "work.txt").exists()
    # A run that ended normally keeping its dirs (keep_dirs) drops its lock: its dirs are not leftovers.
    kept = _spawn(HOLDER.replace("time.sleep(600)", ""), short_tmp, *roots)
    kept_id = kept.stdout.readline().strip()
    assert kept.wait(60) == 0
    (roots[0] / "not-a-run").mkdir()  # anything else there (an older layout, a user's dir) stays too
    _kill9(killed)
    assert (roots[0] / killed_id / "work.txt").exists()  # a kill -9 leaves its dirs

    # The next start: a new run whose first use of each root removes the dead run's dirs.
    new = _spawn(HOLDER, short_tmp, *roots)
    new_id = new.stdout.readline().strip()
    try:
      assert new_id not in (killed_id, live_id, kept_id)  # a resumed run never reuses the dead run's dirs
      for root in roots:
        assert not (root / killed_id).exists()
        assert _owner_pid(root / live_id) == live.pid and (root / live_id / "work.txt").exists()
        assert (root / kept_id / "work.txt").exists() and not (root / kept_id / rundirs.OWNER_LOCK).exists()
        assert (root / new_id / "work.txt").exists()
      assert (roots[0] / "not-a-run").is_dir()
    finally:
      _kill9(new)
  finally:
    for proc in (killed, live):
      if proc.poll() is None:
        _kill9(proc)
  # Once every run is dead, their dirs are leftovers; the kept run's and the other dir still stay.
  removed = rundirs.remove_leftovers(work)
  assert sorted(p.name for p in removed) == sorted([live_id, new_id] * 2)
  assert sorted(p.name for p in roots[0].iterdir()) == sorted([kept_id, "not-a-run"])


def test_a_run_that_ends_normally_removes_its_empty_dirs(tmp_path):
  run = rundirs.Run()
  empty, kept = run.dir(tmp_path / "a"), run.dir(tmp_path / "b")
  assert empty.name == kept.name == run.run_id and run.dir(tmp_path / "a") == empty
  (kept / "rollout").mkdir()
  assert rundirs.remove_dead_runs(tmp_path / "a") == []  # its own live dirs are not leftovers either
  run.close()
  assert not empty.exists()
  assert (kept / "rollout").is_dir() and not (kept / rundirs.OWNER_LOCK).exists()


def test_a_killed_rollouts_workspace_and_relay_dirs_go_at_the_next_start(tmp_path, short_tmp):
  work = tmp_path / "work"
  rollouts, relays = rundirs.rollouts_root(work), rundirs.relays_root()
  killed, live = (_spawn(ROLLOUT, short_tmp, work, "sleep 311") for _ in range(2))
  try:
    # Both harnesses are inside their bash command once each shim has logged its call.
    deadline = time.monotonic() + 240
    while len([p for p in work.glob("logs-*/*.jsonl") if p.stat().st_size]) < 2:
      assert time.monotonic() < deadline and killed.poll() is None and live.poll() is None
      time.sleep(0.5)
    time.sleep(1.0)
    ids = {_owner_pid(d): d.name for d in rollouts.iterdir()}
    killed_id, live_id = ids[killed.pid], ids[live.pid]
    assert [p.name for p in (rollouts / killed_id).iterdir() if p.name != rundirs.OWNER_LOCK]  # its rollout
    bwrap = sandbox.bwrap_problem() is None
    if bwrap:
      assert list((relays / killed_id).glob("r-*/*.sock"))  # the relay of its sandboxed harness
    _kill9(killed)

    new = _spawn(ROLLOUT, short_tmp, work, "true")
    status, new_id = new.communicate(timeout=300)[0].split()
    assert new.returncode == 0 and status == "ok" and new_id not in (killed_id, live_id)
    assert not (rollouts / killed_id).exists() and not (relays / killed_id).exists()
    assert live.poll() is None and _owner_pid(rollouts / live_id) == live.pid
    assert [p.name for p in (rollouts / live_id).iterdir() if p.name != rundirs.OWNER_LOCK]
    if bwrap:
      assert list((relays / live_id).glob("r-*/*.sock"))
    assert not (rollouts / new_id).exists()  # it ended normally: its emptied dirs went with it
  finally:
    for proc in (killed, live):
      if proc.poll() is None:
        _kill9(proc)
