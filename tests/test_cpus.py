"""CPU lists parse as Linux writes them, and pinning a thread moves that thread and what it starts, never
the rest of the process."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from clawjax.config import ConfigError
from clawjax.cpus import check_available, parse_cpu_list, thread_pinned


@pytest.mark.parametrize("text,want", [("", set()), ("3", {3}), ("0-3,8", {0, 1, 2, 3, 8}),
                                       (" 1 , 4-5 ", {1, 4, 5}), ("2-2", {2})])
def test_cpu_lists(text, want):
  assert parse_cpu_list(text, "config.rollout.cores") == want


@pytest.mark.parametrize("text,why", [("a", "not a cpu list"), ("1-", "not a cpu list"),
                                      ("3-1", "empty or negative"), ("-1", "not a cpu list")])
def test_bad_cpu_lists_name_the_field(text, why):
  with pytest.raises(ConfigError, match=rf"^config\.rollout\.cores: .*{why}"):
    parse_cpu_list(text, "config.rollout.cores")


def test_cores_the_process_lacks_are_refused():
  everything = frozenset(os.sched_getaffinity(0))
  with thread_pinned(frozenset({min(everything)})):  # the checking thread's own pin does not matter
    check_available(everything, "f")
  with pytest.raises(ConfigError, match=r"^f: cores \[100000\]: none of them can be used here"):
    check_available(frozenset({100_000}), "f")
  with pytest.raises(ConfigError, match=rf"^f: cores .*: only \[{', '.join(map(str, sorted(everything)))}\] can"):
    check_available(everything | {100_000}, "f")


def _child_affinity() -> set[int]:
  out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                       capture_output=True, text=True, check=True).stdout
  return set(eval(out))  # pylint: disable=eval-used  (a list of ints this test's child printed)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell them apart")
def test_a_pinned_thread_and_its_children_move_and_the_process_stays():
  everything = os.sched_getaffinity(0)
  one = frozenset({max(everything)})
  seen: dict[str, set[int]] = {}

  with thread_pinned(one):
    seen["pinned"] = os.sched_getaffinity(0)
    seen["child"] = _child_affinity()
    inside = threading.Thread(target=lambda: seen.setdefault("started", os.sched_getaffinity(0)))
    inside.start()
    inside.join()
  with thread_pinned(frozenset()):
    seen["unpinned"] = os.sched_getaffinity(0)
  after = threading.Thread(target=lambda: seen.setdefault("after", os.sched_getaffinity(0)))
  after.start()
  after.join()
  assert seen["pinned"] == seen["child"] == seen["started"] == one
  assert os.sched_getaffinity(0) == seen["unpinned"] == seen["after"] == everything
