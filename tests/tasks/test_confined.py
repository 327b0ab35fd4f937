"""A checker's leftovers: a `setsid` sleeper and a double-forked daemon (what agent-written tests may
leave) neither hold the score past the checker's timeout nor outlive the checker, under every
confinement this host allows; where none does, the output is still read by a deadline."""
from __future__ import annotations

import os
import secrets
import signal
import time

import pytest

from clawjax.tasks import ScoringConfig, make_workspace, parse_jsonl_task, run_checker
from clawjax.tasks.confined import DRAIN_S, candidates, confinement, run_confined, works

from tests.tasks.leftovers import alive, gone

DAEMON = ("import os, sys, time\n"
          "if os.fork(): os._exit(0)\n"
          "os.setsid()\n"
          "if os.fork(): os._exit(0)\n"
          "time.sleep(30)\n")
PID_NAMESPACES = [c for c in candidates(True) + candidates(False) if c.processes.startswith("pid namespace") and works(c)]


def _leftovers(marker: str) -> str:
  """Shell lines that leave a setsid sleeper and a double-forked daemon, each named by `marker`, both
  holding the checker's stdout."""
  return (f"setsid bash -c 'exec -a {marker}-sleeper sleep 30' &\n"
          f"python3 -c '{DAEMON}' {marker}-daemon\n")


@pytest.fixture
def marker():
  name = f"clawjax-leftover-{secrets.token_hex(6)}"
  yield name
  for pid in alive(name):  # what a session-only run (or a failing test) left: ours to end
    os.kill(pid, signal.SIGKILL)


def _task(command: str):
  return parse_jsonl_task({"task_id": "leftovers", "prompt": "p", "hook_code": command}, "t")


@pytest.mark.skipif(not PID_NAMESPACES, reason="no PID namespace on this host (unshare --pid, bwrap)")
def test_a_timed_out_checker_returns_in_time_and_takes_its_leftovers_along(tmp_path, marker):
  task = _task(_leftovers(marker) + "echo started; sleep 30\n")
  t0 = time.monotonic()
  result = run_checker(task, make_workspace(task, tmp_path), ScoringConfig(timeout_s=1.0))
  took = time.monotonic() - t0
  assert took < 1.0 + DRAIN_S + 2, took
  assert result.code_score == 0.0 and result.error.startswith("checker timed out after 1 s and was killed (pid namespace")
  assert result.details["processes"].startswith("pid namespace") and "started" in result.details["stdout_tail"]
  assert gone(marker), f"left running: {alive(marker)}"


@pytest.mark.skipif(not PID_NAMESPACES, reason="no PID namespace on this host (unshare --pid, bwrap)")
def test_a_checker_that_exits_is_scored_at_once_and_its_leftovers_end(tmp_path, marker):
  task = _task(_leftovers(marker) + "echo 1.0\n")
  t0 = time.monotonic()
  result = run_checker(task, make_workspace(task, tmp_path), ScoringConfig(timeout_s=20.0))
  assert time.monotonic() - t0 < 10
  assert (result.code_score, result.error, result.details["returncode"]) == (1.0, None, 0)
  assert gone(marker), f"left running: {alive(marker)}"


@pytest.mark.parametrize("how", PID_NAMESPACES, ids=lambda c: " ".join(c.prefix[:3]))
def test_every_pid_namespace_here_holds_the_leftovers(tmp_path, marker, how):
  for tail, timeout_s in (("echo done", 20.0), ("sleep 30", 1.0)):
    t0 = time.monotonic()
    run = run_confined(["bash", "-c", _leftovers(marker) + tail], tmp_path, {"PATH": os.environ["PATH"]},
                       timeout_s, how)
    assert time.monotonic() - t0 < timeout_s + DRAIN_S + 2
    assert run.returncode == (0 if tail == "echo done" else None), run.stderr
    assert gone(marker), (how, tail, alive(marker))


def test_without_a_namespace_the_output_is_still_read_by_a_deadline(tmp_path, marker):
  """The session-only fallback cannot end a setsid process; the checker still returns in time, with the
  output it printed before the kill."""
  (session_only,) = [c for c in candidates(False) if not c.prefix]
  t0 = time.monotonic()
  run = run_confined(["bash", "-c", _leftovers(marker) + "echo started; sleep 30"], tmp_path,
                     {"PATH": os.environ["PATH"]}, 1.0, session_only)
  assert time.monotonic() - t0 < 1.0 + DRAIN_S + 2
  assert run.returncode is None and run.stdout == "started\n"


def test_the_score_says_what_held_the_checker(tmp_path):
  task = _task("echo 1.0")
  details = run_checker(task, make_workspace(task, tmp_path)).details
  assert {k: details[k] for k in ("processes", "network")} == confinement(True).details()
