"""The incremental call-log writer writes exactly what CallLogWriter writes."""
import random

import pytest

from clawjax.calllog import CallLogWriter, CallRecord, load
from clawjax.serving.logwriter import RolloutLogWriter


def _record(i, input_ids, output_ids, task_id='t "quoted" "input_ids":[]'):
  return CallRecord(rollout_id="r1", task_id=task_id, harness="claude-code", call_index=i,
                    status="ok", input_ids=tuple(input_ids), output_ids=tuple(output_ids),
                    output_logprobs=tuple(-0.25 * (k % 5) for k in range(len(output_ids))),
                    role="main", finish_reason="stop", model="m", t_start=1.5, t_end=2.5,
                    policy_version=3, extra={"spliced_turns": i, "note": "x\ny"})


def test_lines_are_byte_identical_to_calllogwriter(tmp_path):
  rng = random.Random(0)
  fast = RolloutLogWriter(tmp_path / "fast.jsonl", cached_sequences=2)
  ref = CallLogWriter(tmp_path / "ref.jsonl")
  history: list[int] = []
  main_line = []
  for i in range(12):
    if i % 4 == 3:  # A side call (e.g. a subagent) from a different prefix, then back to main.
      inp = [rng.randrange(151_000) for _ in range(rng.randrange(1, 50))]
    elif i % 5 == 4:  # A retry of the previous main input, cut short.
      inp = main_line[:len(main_line) // 2]
    else:
      inp = history + [rng.randrange(151_000) for _ in range(rng.randrange(0, 40))]
      main_line = inp
    out = [rng.randrange(151_000) for _ in range(rng.randrange(0, 20))]
    rec = _record(i, inp, out)
    if i % 2:
      fast.write_call(rec)
    else:
      fast.write_call(rec, fast.encode_ids(list(rec.input_ids)))
    ref.write(rec)
    if inp is main_line:
      history = inp + out
  fast.close()
  ref.close()
  assert (tmp_path / "fast.jsonl").read_bytes() == (tmp_path / "ref.jsonl").read_bytes()
  assert len(load(tmp_path / "fast.jsonl").calls["r1"]) == 12


def test_encode_ids_validates_and_matches_json(tmp_path):
  w = RolloutLogWriter(tmp_path / "a.jsonl")
  assert w.encode_ids([]) == "[]"
  w.write_call(_record(0, [1, 2, 3], [4]))
  assert w.encode_ids([1, 2, 3, 4, 5]) == "[1,2,3,4,5]"
  assert w.encode_ids([1, 2, 3, 4]) == "[1,2,3,4]"
  with pytest.raises(ValueError, match="token id 4"):
    w.encode_ids([1, 2, 3, 4, -1])
  with pytest.raises(ValueError):
    w.write_call(_record(1, [1, 2], [True]))
  w.close()
