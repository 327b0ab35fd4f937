"""Which file each exported tensor goes to and which process writes it (`hf_io.plan_files`); the files
of a real 2-process export are checked in tests/test_distributed.py."""
from __future__ import annotations

import pytest

from clawjax.models.hf_io import plan_files

SIZES = [(f"t{i}", n) for i, n in enumerate([40, 10, 10, 30, 5, 5, 60, 20, 10, 10])]  # 200 bytes


def test_one_process_fills_files_in_order_up_to_the_limit():
  assert [(f.name, f.owner, f.tensors) for f in plan_files(SIZES, 1, 1000)] == [
      ("model.safetensors", 0, tuple(n for n, _ in SIZES))]
  files = plan_files(SIZES, 1, 60)
  # Hugging Face's rule: a tensor that would overflow the file starts the next one; a larger one alone.
  assert [f.tensors for f in files] == [("t0", "t1", "t2"), ("t3", "t4", "t5"), ("t6",), ("t7", "t8", "t9")]
  assert [f.name for f in files] == [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


@pytest.mark.parametrize("processes,limit", [(2, 1000), (3, 1000), (2, 50), (4, 50)])
def test_several_processes_each_write_a_run_of_about_equal_bytes(processes, limit):
  files = plan_files(SIZES, processes, limit)
  order = [n for f in files for n in f.tensors]
  assert order == [n for n, _ in SIZES]  # every tensor once, in order
  owners = [f.owner for f in files]
  assert owners == sorted(owners) and set(owners) == set(range(processes))
  size = dict(SIZES)
  per_process = [sum(size[n] for f in files if f.owner == p for n in f.tensors) for p in range(processes)]
  # Each run is within one tensor of an equal share.
  assert max(per_process) - 200 / processes <= max(size.values())
  for f in files:
    assert sum(size[n] for n in f.tensors) <= limit or len(f.tensors) == 1
  assert [f.name for f in files] == [f"model-{i:05d}-of-{len(files):05d}.safetensors"
                                     for i in range(1, len(files) + 1)]


def test_more_processes_than_tensors_leave_some_without_a_file():
  files = plan_files([("a", 10), ("b", 10)], 4, 1000)
  assert [f.tensors for f in files] == [("a",), ("b",)] and len({f.owner for f in files}) == 2
