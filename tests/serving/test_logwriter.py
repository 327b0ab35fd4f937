"""The incremental call-log writer: its lines load back to exactly the records written, each input
only once in full, and the engine gets the same ids as the log."""
import errno
import json
import os
import random

import pytest

from clawjax.calllog import CallLogWriter, CallRecord, load
from clawjax.serving.logwriter import RolloutLogWriter


def _record(i, input_ids, output_ids, task_id='t "quoted" "input_ids":[]'):
  return CallRecord(rollout_id="r1", task_id=task_id, harness="claude_code", call_index=i,
                    status="ok", input_ids=tuple(input_ids), output_ids=tuple(output_ids),
                    output_logprobs=tuple(-0.25 * (k % 5) - 1e-5 for k in range(len(output_ids))),
                    role="main", finish_reason="stop", model="m", t_start=1.5, t_end=2.5,
                    policy_version=3, extra={"spliced_turns": i, "note": "x\ny é"})


def _rollout(rng, n_calls):
  """Inputs shaped like a harness's: a main line that grows by each output and new ids, side calls
  (subagents) from other prefixes, retries of earlier inputs, and a compaction that starts over."""
  history: list[int] = []
  main_inputs = []
  for i in range(n_calls):
    if i % 4 == 3:  # A side call from a different prefix.
      inp = [rng.randrange(151_000) for _ in range(rng.randrange(1, 50))]
    elif i % 5 == 4 and main_inputs:  # A retry of an earlier main input, or of part of it.
      prev = rng.choice(main_inputs)
      inp = prev if rng.random() < 0.5 else prev[:len(prev) // 2]
    elif i == 9:  # Compaction: a fresh, short context.
      inp = [rng.randrange(151_000) for _ in range(5)]
      history = []
    else:
      inp = history + [rng.randrange(151_000) for _ in range(rng.randrange(0, 40))]
      main_inputs.append(inp)
    out = [rng.randrange(151_000) for _ in range(rng.randrange(0, 20))]
    yield _record(i, inp, out)
    if inp in main_inputs:
      history = inp + out


@pytest.mark.parametrize("seed", range(4))
def test_lines_load_back_to_the_records_written(tmp_path, seed):
  rng = random.Random(seed)
  fast = RolloutLogWriter(tmp_path / "fast.jsonl", cached_calls=2)
  ref = CallLogWriter(tmp_path / "ref.jsonl")
  records = list(_rollout(rng, 16))
  for rec in records:
    encoded = fast.encode_ids(list(rec.input_ids), rec.call_index)
    assert json.loads(encoded.engine_json) == list(rec.input_ids)  # What the engine is sent.
    fast.write_call(rec, encoded if rec.call_index % 2 else None)
    ref.write(rec)
  fast.close()
  ref.close()
  assert load(tmp_path / "fast.jsonl").calls["r1"] == records
  assert load(tmp_path / "ref.jsonl").calls["r1"] == records
  lines = [json.loads(line) for line in (tmp_path / "fast.jsonl").read_text().splitlines()]
  assert sum("input_ref" in obj for obj in lines) >= len(records) // 3


def test_a_long_rollout_log_grows_with_new_tokens_only(tmp_path):
  rng = random.Random(0)
  w = RolloutLogWriter(tmp_path / "a.jsonl")
  history, sizes = [rng.randrange(1000) for _ in range(20_000)], []
  for i in range(30):
    inp = history + [rng.randrange(1000) for _ in range(300)]
    out = [rng.randrange(1000) for _ in range(50)]
    w.write_call(_record(i, inp, out))
    sizes.append((tmp_path / "a.jsonl").stat().st_size)
    history = inp + out
  w.close()
  line_bytes = [b - a for a, b in zip(sizes, sizes[1:])]
  assert max(line_bytes) < 4_000  # 350 new ids and the metadata, not the ~30K-id context.
  assert load(tmp_path / "a.jsonl").calls["r1"][-1].input_ids == tuple(inp)


def test_references_go_to_earlier_calls_only(tmp_path):
  w = RolloutLogWriter(tmp_path / "a.jsonl")
  w.write_call(_record(5, [1, 2, 3], [4]))
  # Call 3 arrived before call 5 (the writer sees call indexes out of order): it may not refer to it.
  assert w.encode_ids([1, 2, 3, 4, 9], 3).log_field == b'"input_ids":[1,2,3,4,9]'
  assert w.encode_ids([1, 2, 3, 4, 9], 6).log_field.startswith(b'"input_ref":{"call_index":5,"length":4}')
  assert w.encode_ids([1, 2, 3, 4], 6).log_field == b'"input_ref":{"call_index":5,"length":4},"input_tail":[]'
  w.close()


def test_encode_ids_validates_and_matches_json(tmp_path):
  w = RolloutLogWriter(tmp_path / "a.jsonl")
  assert w.encode_ids([], 0).engine_json == b"[]"
  w.write_call(_record(0, [1, 2, 3], [4]))
  assert w.encode_ids([1, 2, 3, 4, 5], 1).engine_json == b"[1,2,3,4,5]"
  assert w.encode_ids([1, 2, 3, 4], 1).engine_json == b"[1,2,3,4]"
  with pytest.raises(ValueError, match="element 4 is -1"):
    w.encode_ids([1, 2, 3, 4, -1], 1)
  with pytest.raises(ValueError):
    w.write_call(_record(1, [1, 2], [True]))
  w.close()


@pytest.mark.parametrize("fails_at", ["write", "fsync"])
def test_a_failed_write_is_cut_back_and_never_referred_to(tmp_path, monkeypatch, fails_at):
  """Half a line written, then ENOSPC (or a failed fsync): the file is back to its whole lines, the
  error is raised, and the next record neither follows a torn line nor refers to the failed one."""
  w = RolloutLogWriter(tmp_path / "a.jsonl")
  w.write_call(_record(0, [1, 2, 3], [4]))
  whole = (tmp_path / "a.jsonl").read_bytes()
  real_writev = os.writev

  def half_then_full(fd, buffers):
    data = b"".join(buffers)
    os.write(fd, data[:len(data) // 2])  # (os.write itself is still the real one here.)
    if fails_at == "write":
      monkeypatch.setattr(os, "write", enospc)
      return len(data) // 2
    os.write(fd, data[len(data) // 2:])
    return len(data)

  def enospc(*_):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "writev", half_then_full)
  if fails_at == "fsync":
    monkeypatch.setattr(os, "fsync", lambda fd: enospc())
  failed = _record(1, [1, 2, 3, 4, 5], [6])
  encoded = w.encode_ids(failed.input_ids, 1)
  with pytest.raises(OSError, match="No space"):
    w.append(w.call_line(failed, encoded))
  monkeypatch.undo()
  assert (tmp_path / "a.jsonl").read_bytes() == whole
  # (The server caches a call's prefix only once its record is on disk: call 1 stays unknown.)
  assert w.encode_ids([1, 2, 3, 4, 5, 6, 7], 2).log_field.startswith(b'"input_ref":{"call_index":0,')
  w.write_call(_record(2, [1, 2, 3, 4, 5, 6, 7], [8]))
  w.close()
  assert [c.call_index for c in load(tmp_path / "a.jsonl").calls["r1"]] == [0, 2]
  assert real_writev is os.writev


def test_without_fsync_lines_are_still_written_before_returning(tmp_path, monkeypatch):
  synced = []
  monkeypatch.setattr(os, "fsync", synced.append)
  w = CallLogWriter(tmp_path / "r.jsonl", fsync=False)
  w.write(_record(0, [1], [2]))
  assert not synced and len(load(tmp_path / "r.jsonl").calls["r1"]) == 1
  w.close()
