"""A rollout's call-log writer that keeps the 20K-token JSON encoding off the response's critical path.

A call's record repeats its whole input (~20K ids for a Claude Code call), and the next call's input
extends this call's input + output. Encoding the ids is the shim's largest per-call cost, so this
writer (a `CallLogWriter`: same file format, same validation, same fsync) encodes incrementally: it
keeps the JSON text of the last few id sequences written and encodes only the part of a new sequence
past the longest of them that is its prefix. The server calls `encode_ids` while the engine generates
and `write_call` once the output is known, so only the output and the fsync remain on the critical path.
The line written is byte-identical to `CallLogWriter.write(record)` (tested).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading

from clawjax.calllog import CALL_SCHEMA, CallLogWriter, CallRecord, parse_record

_PLACEHOLDER = '"input_ids":[]'


def _check_ids(ids: list[int], start: int) -> None:
  for i in range(start, len(ids)):
    t = ids[i]
    if type(t) is not int or t < 0:  # pylint: disable=unidiomatic-typecheck
      raise ValueError(f"token id {i} is {t!r}, not a non-negative integer")


class RolloutLogWriter(CallLogWriter):

  def __init__(self, path: str | os.PathLike[str], cached_sequences: int = 4):
    super().__init__(path)
    # (ids, their comma-joined text): the latest sequences written, most recent last. More than one,
    # so a rollout's interleaved main-agent and subagent calls both stay incremental.
    self._seqs: list[tuple[list[int], str]] = []
    self._cached_sequences = cached_sequences
    self._seq_lock = threading.Lock()

  def encode_ids(self, ids: list[int]) -> str:
    """The JSON array text of `ids`, reusing the text of a cached prefix (validates the new ids)."""
    with self._seq_lock:
      seqs = sorted(self._seqs, key=lambda entry: len(entry[0]), reverse=True)
    best, best_n, best_text = None, 0, ""
    for entry in seqs:  # Longest first; two probes reject most non-prefixes before the full compare.
      seq, text = entry
      n = len(seq)
      if 0 < n <= len(ids) and ids[n - 1] == seq[-1] and ids[n // 2] == seq[n // 2] and ids[:n] == seq:
        best, best_n, best_text = entry, n, text
        break
    if best is not None:
      with self._seq_lock:  # Least recently used goes first: a prefix that keeps matching stays.
        i = next((i for i, entry in enumerate(self._seqs) if entry is best), None)
        if i is not None:  # (Identity: `in` would compare 20K-id lists.)
          self._seqs.append(self._seqs.pop(i))
    _check_ids(ids, best_n)
    tail = ",".join(map(str, ids[best_n:]))
    return "[" + (best_text + "," + tail if best_n and tail else best_text or tail) + "]"

  def write_call(self, record: CallRecord, input_json: str | None = None) -> None:
    """Appends `record` (fsynced); `input_json` is `encode_ids(record.input_ids)` if already done."""
    input_ids = list(record.input_ids)
    if input_json is None:
      input_json = self.encode_ids(input_ids)
    # Validated by encode_ids and spliced into the line below, so not copied into the JSON object.
    obj = dataclasses.replace(record, input_ids=()).to_json()
    parse_record(obj, f"{self.path}:<new {CALL_SCHEMA} record>")
    line = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    # JSON escapes every quote inside a string value, so the first match is the key itself.
    self.append_line(line.replace(_PLACEHOLDER, '"input_ids":' + input_json, 1) + "\n")
    history = input_ids + list(record.output_ids)
    output_text = ",".join(map(str, record.output_ids))
    body = input_json[1:-1]
    with self._seq_lock:
      self._seqs.append((history, body + "," + output_text if body and output_text
                         else body or output_text))
      del self._seqs[:-self._cached_sequences]

  def close(self) -> None:
    super().close()
    with self._seq_lock:
      self._seqs.clear()
