"""Call-log validation: every bad field is an error naming file, line and field; collect mode keeps
the good rollouts; the writer fsyncs each record and what it writes loads back equal, routes included
(each position once, in the sidecar)."""

import json
import os

import numpy as np
import pytest

from clawjax import calllog
from clawjax.calllog import CallLogError, CallLogWriter, CallRecord, RolloutRecord
from clawjax.routes import RoutedExperts

GOOD_CALL = {
    "schema": "clawjax.call/1", "rollout_id": "r1", "task_id": "t", "harness": "h", "call_index": 0,
    "status": "ok", "input_ids": [1, 2, 3], "output_ids": [4, 5], "output_logprobs": [-0.5, -1.25],
    "role": "main", "finish_reason": "stop", "model": "m", "t_start": 1.0, "t_end": 2.0,
}
GOOD_ROLLOUT = {"schema": "clawjax.rollout/1", "rollout_id": "r1", "task_id": "t", "harness": "h",
                "reward": 0.5, "status": "ok"}

CALL_REQUIRED = [k for k in GOOD_CALL if k != "schema"]
ROLLOUT_REQUIRED = [k for k in GOOD_ROLLOUT if k != "schema"]
BAD_CALL_VALUES = [
    ("rollout_id", 7), ("task_id", None), ("harness", ["h"]), ("call_index", -1), ("call_index", 1.5),
    ("call_index", True), ("status", "done"), ("input_ids", [1, -2]), ("input_ids", "1 2"),
    ("input_ids", [1, 2**31]), ("output_ids", [4, 5.0]), ("output_logprobs", [-0.5]),
    ("output_logprobs", [-0.5, "x"]), ("output_logprobs", [-0.5, 0.5]),
    ("output_logprobs", [-0.5, float("nan")]), ("output_logprobs", [float("-inf"), -1.0]),
    ("role", "assistant"), ("finish_reason", 3), ("model", None), ("t_start", "now"),
    ("t_end", float("inf")), ("policy_version", "v1"), ("extra", [1]),
]
BAD_ROLLOUT_VALUES = [
    ("reward", None), ("reward", float("nan")), ("reward", "1"), ("status", "crashed"),
    ("rollout_id", None), ("task_id", 1), ("harness", None), ("extra", "x"),
]


def write_lines(path, objs):
  # allow_nan: the log may contain NaN / Infinity written by a non-strict producer.
  path.write_text("".join(json.dumps(o) + "\n" for o in objs))
  return path


def expect_error(path, line, field):
  with pytest.raises(CallLogError) as info:
    calllog.load(path)
  msg = str(info.value)
  assert msg.startswith(f"{path}:{line}") and (field is None or f"field {field!r}" in msg), msg
  assert info.value.field == field


@pytest.mark.parametrize("field,value", BAD_CALL_VALUES)
def test_bad_call_field_names_file_line_and_field(tmp_path, field, value):
  bad = {**GOOD_CALL, "call_index": 1, field: value}
  path = write_lines(tmp_path / "calls.jsonl", [GOOD_CALL, GOOD_ROLLOUT, bad])
  expect_error(path, 3, field)


@pytest.mark.parametrize("field,value", BAD_ROLLOUT_VALUES)
def test_bad_rollout_field_names_file_line_and_field(tmp_path, field, value):
  path = write_lines(tmp_path / "calls.jsonl", [GOOD_CALL, {**GOOD_ROLLOUT, field: value}])
  expect_error(path, 2, field)


@pytest.mark.parametrize("field", CALL_REQUIRED + ["schema"])
def test_missing_call_field(tmp_path, field):
  bad = {k: v for k, v in GOOD_CALL.items() if k != field}
  expect_error(write_lines(tmp_path / "c.jsonl", [bad]), 1, field)


@pytest.mark.parametrize("field", ROLLOUT_REQUIRED)
def test_missing_rollout_field(tmp_path, field):
  bad = {k: v for k, v in GOOD_ROLLOUT.items() if k != field}
  expect_error(write_lines(tmp_path / "c.jsonl", [bad]), 1, field)


@pytest.mark.parametrize("line,field", [("{not json", None), ("[1, 2]", None),
                                        (json.dumps({**GOOD_CALL, "schema": "x/1"}), "schema")])
def test_malformed_line(tmp_path, line, field):
  path = tmp_path / "c.jsonl"
  path.write_text(json.dumps(GOOD_CALL) + "\n\n" + line + "\n")
  expect_error(path, 3, field)


def test_cross_record_conflicts_name_the_line(tmp_path):
  expect_error(write_lines(tmp_path / "a.jsonl", [GOOD_CALL, GOOD_CALL]), 2, "call_index")
  expect_error(write_lines(tmp_path / "b.jsonl", [GOOD_ROLLOUT, GOOD_ROLLOUT]), 2, "rollout_id")
  expect_error(write_lines(tmp_path / "c.jsonl", [GOOD_CALL, {**GOOD_ROLLOUT, "harness": "x"}]), 2,
               "task_id/harness")


def test_collect_mode_keeps_good_rollouts_and_drops_broken_ones_whole(tmp_path):
  good2 = {**GOOD_CALL, "rollout_id": "r2", "call_index": 1}
  bad2 = {**GOOD_CALL, "rollout_id": "r2", "call_index": 0, "output_logprobs": [0.0]}
  objs = [GOOD_CALL, {**GOOD_CALL, "call_index": 1}, GOOD_ROLLOUT, good2, bad2,
          {**GOOD_ROLLOUT, "rollout_id": "r2"}]
  log = calllog.load(write_lines(tmp_path / "c.jsonl", objs), errors="collect")
  assert sorted(log.calls) == ["r1"] and sorted(log.rollouts) == ["r1"]
  assert [c.call_index for c in log.calls["r1"]] == [0, 1]
  assert len(log.problems) == 1 and ":5:" in log.problems[0] and "output_logprobs" in log.problems[0]


def test_directory_load_sorts_calls_and_joins_files(tmp_path):
  write_lines(tmp_path / "b.jsonl", [{**GOOD_CALL, "call_index": 2}, GOOD_CALL])
  write_lines(tmp_path / "a.jsonl", [GOOD_ROLLOUT])
  (tmp_path / "notes.txt").write_text("ignored")
  log = calllog.load(tmp_path)
  assert [c.call_index for c in log.calls["r1"]] == [0, 2]
  assert log.rollouts["r1"].reward == 0.5 and log.rollout_ids() == ["r1"]


def test_writer_fsyncs_every_record_and_round_trips(tmp_path, monkeypatch):
  synced = []
  real_fsync = os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
  call = calllog.parse_record(GOOD_CALL, "x")
  records = [call, CallRecord(**{**call.__dict__, "call_index": 1, "role": None, "status": "error",
                                 "output_ids": (), "output_logprobs": (), "policy_version": 3,
                                 "extra": {"error": "HTTP 500"}}),
             RolloutRecord("r1", "t", "h", None, "timeout", {"wall_s": 3.5})]
  path = tmp_path / "sub" / "log.jsonl"
  with CallLogWriter(path) as w:
    for i, r in enumerate(records):
      w.write(r)
      assert len(synced) == i + 1  # on disk before write() returned
      assert len(path.read_text().splitlines()) == i + 1
  assert list(calllog.iter_records(path)) == records
  with CallLogWriter(path) as w, pytest.raises(CallLogError, match="output_logprobs"):
    w.write(CallRecord(**{**call.__dict__, "output_logprobs": (float("nan"), -1.0)}))
  assert len(path.read_text().splitlines()) == 3  # the invalid record was not written


def _ref_call(index, ref_index, length, tail, **changes):
  obj = {k: v for k, v in GOOD_CALL.items() if k != "input_ids"}
  return {**obj, "call_index": index, "input_ref": {"call_index": ref_index, "length": length},
          "input_tail": tail, **changes}


def test_reference_form_resolves_in_any_line_order(tmp_path):
  # Call 0: input [1,2,3], output [4,5]. Call 1 extends it; call 2 refers to call 1 (itself a
  # reference); call 3 retries call 1's input; their lines are out of order in the file.
  objs = [_ref_call(2, 1, 8, [8]), GOOD_CALL, _ref_call(3, 1, 6, []), _ref_call(1, 0, 5, [6])]
  log = calllog.load(write_lines(tmp_path / "c.jsonl", objs))
  assert [c.input_ids for c in log.calls["r1"]] == [
      (1, 2, 3), (1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5, 6, 4, 5, 8), (1, 2, 3, 4, 5, 6)]
  assert list(calllog.iter_records(tmp_path / "c.jsonl"))[0].input_ids == (1, 2, 3, 4, 5, 6, 4, 5, 8)


@pytest.mark.parametrize("bad,field", [
    (_ref_call(1, 1, 2, []), "input_ref"),  # not an earlier call
    (_ref_call(1, 0, 6, []), "input_ref"),  # longer than call 0's 5 input + output ids
    (_ref_call(1, 7, 2, [], call_index=9), "input_ref"),  # call 7 is not in the file
    (_ref_call(1, 0, -1, []), "input_ref"),
    ({**_ref_call(1, 0, 2, []), "input_ref": {"call_index": 0}}, "input_ref"),
    (_ref_call(1, 0, 2, [1, -1]), "input_tail"),
    ({k: v for k, v in _ref_call(1, 0, 2, []).items() if k != "input_tail"}, "input_tail"),
    ({**_ref_call(1, 0, 2, []), "input_ids": [1]}, "input_ids"),
])
def test_bad_reference_names_line_and_field(tmp_path, bad, field):
  expect_error(write_lines(tmp_path / "c.jsonl", [GOOD_CALL, bad]), 2, field)


def test_collect_mode_drops_a_rollout_whose_reference_is_broken(tmp_path):
  objs = [GOOD_CALL, {**GOOD_CALL, "rollout_id": "r2"}, _ref_call(1, 0, 5, [6], rollout_id="r2"),
          _ref_call(2, 1, 3, [], rollout_id="r2")]
  objs[2]["output_logprobs"] = [0.5, -1.0]  # r2's call 1 is invalid, so call 2 cannot resolve
  log = calllog.load(write_lines(tmp_path / "c.jsonl", objs), errors="collect")
  assert sorted(log.calls) == ["r1"]
  assert any(":3:" in p and "output_logprobs" in p for p in log.problems)
  assert any(":4:" in p and "input_ref" in p for p in log.problems)


def _routes(seq_len, start=0, layers=2, top_k=2, seed=0):
  ids = np.random.default_rng(seed).integers(0, 200, (seq_len - 1, layers, top_k))
  return ids[start:]


def _written_with_routes(tmp_path):
  """Call 0 (input [1,2,3], output [4,5]) with its routes, then call 1 in the reference form past them, and
  an unrelated call 2 with routes of its own; as the shim's writer writes them."""
  call0 = calllog.parse_record(GOOD_CALL, "x")
  full1 = _routes(8, seed=1)
  full1[:4] = _routes(5)  # call 1 repeats call 0's positions
  call1 = CallRecord(**{**call0.__dict__, "call_index": 1, "input_ids": (1, 2, 3, 4, 5, 6), "output_ids": (7, 8),
                        "routed_experts": RoutedExperts(4, full1[4:])})
  call0 = CallRecord(**{**call0.__dict__, "routed_experts": RoutedExperts(0, _routes(5))})
  call2 = CallRecord(**{**call0.__dict__, "call_index": 2, "routed_experts": RoutedExperts(0, _routes(5, seed=2))})
  path = tmp_path / "log.jsonl"
  with CallLogWriter(path) as w:
    w.write(call0)
    w.append(calllog.record_line(call1, "x", b'"input_ref":{"call_index":0,"length":5},"input_tail":[6]'))
    w.write(call2)
  return path, full1


def test_routes_round_trip_through_the_sidecar_once_per_position(tmp_path):
  path, full1 = _written_with_routes(tmp_path)
  calls = calllog.load(path).calls["r1"]
  assert [c.routed_experts.start for c in calls] == [0, 4, 0]
  assert np.array_equal(calls[0].routed_experts.full(), _routes(5))
  assert np.array_equal(calls[1].routed_experts.full(), full1) and calls[1].routed_experts.before is calls[0].routed_experts
  assert calls[2].routed_experts.full().dtype == np.uint8
  # 4 + 3 + 4 positions x 2 layers x 2 choices, one byte each (ids < 256)
  assert os.path.getsize(str(path) + calllog.ROUTES_SUFFIX) == 11 * 4
  assert "routed_experts" not in calls[0].to_json()


def _edit_line(path, n, change):
  lines = path.read_text().splitlines()
  obj = json.loads(lines[n - 1])
  change(obj)
  lines[n - 1] = json.dumps(obj)
  path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("line,change", [
    (1, lambda o: o["routed_experts"].update(dtype="int64")),
    (1, lambda o: o["routed_experts"].update(shape=[4, 2])),
    (1, lambda o: o["routed_experts"].update(offset=-1)),
    (1, lambda o: o["routed_experts"].pop("crc32")),
    (1, lambda o: o["routed_experts"].update(crc32=o["routed_experts"]["crc32"] ^ 1)),  # not these bytes
    (1, lambda o: o["routed_experts"].update(offset=10_000)),  # past the sidecar's end
    (1, lambda o: o["routed_experts"].update(shape=[3, 2, 2])),  # short of the 4 computed positions
    (3, lambda o: o["routed_experts"].update(start=2, shape=[2, 2, 2])),  # start > 0 without input_ref
    (2, lambda o: o.update(input_ref={"call_index": 0, "length": 3}, input_tail=[4, 5, 6])),  # stops before start
])
def test_bad_routes_name_line_and_field(tmp_path, line, change):
  path, _ = _written_with_routes(tmp_path)
  _edit_line(path, line, change)
  expect_error(path, line, "routed_experts")


def test_a_missing_sidecar_names_it_and_collect_mode_keeps_other_rollouts(tmp_path):
  path, _ = _written_with_routes(tmp_path)
  with open(path, "a") as f:
    f.write(json.dumps({**GOOD_CALL, "rollout_id": "r2"}) + "\n")
  os.remove(str(path) + calllog.ROUTES_SUFFIX)
  with pytest.raises(CallLogError, match="routes sidecar"):
    calllog.load(path)
  log = calllog.load(path, errors="collect")
  assert sorted(log.calls) == ["r2"] and log.calls["r2"][0].routed_experts is None
