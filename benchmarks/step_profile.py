"""Where a step's device time goes: one call under the JAX profiler, its accelerator events summed by name.

`profile_step(step)` runs `step()` once to compile and warm up, then once more under `jax.profiler` with a
Perfetto trace, and reads that trace back: every complete event on a device process ("/device:GPU:0", a
TPU's) is summed by its thread (the trace's "XLA Ops" line, each stream's kernels, ...) and by its name
(an HLO instruction or a kernel), and each name is sorted into a kind (matmul, attention kernel, other
fusion, copy or convert, collective, ...) by its name. Off an accelerator (the CPU backend) the trace
holds host events only, and the summary says so (`device_events` 0).

  python benchmarks/step_profile.py TRACE.json.gz   # the summary of a trace taken elsewhere
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import sys
import tempfile
from collections.abc import Callable
from typing import Any

# First match wins; names are HLO instruction names ("fusion.12", "custom-call.3") or kernel names.
KINDS = (("matmul", re.compile(r"gemm|cublas|cutlass|xmma|matmul|\bdot|wgmma|sm\d+_", re.I)),
         ("attention_kernel", re.compile(r"attention|attend|flash", re.I)),  # the tree kernels' calls are named so
         ("collective", re.compile(r"nccl|all-?reduce|all-?gather|reduce-?scatter|all-?to-?all|collective", re.I)),
         ("copy_convert", re.compile(r"copy|convert|transpose|memcpy|memset|dynamic-update-slice", re.I)),
         ("reduce", re.compile(r"reduce|scatter", re.I)),
         ("fusion", re.compile(r"fusion|loop_|input_", re.I)))
TOP = 30


def kind_of(name: str) -> str:
  return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def summarize(trace: dict | list) -> dict[str, Any]:
  """The device time of a Chrome/Perfetto trace: per device thread, its total and its events by name and
  kind. The thread with the most distinct names (the per-op line where there is one) gives `top` and
  `by_kind`."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
  per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in devices:
      thread = f"{processes[e['pid']]} {threads.get((e['pid'], e.get('tid')), e.get('tid'))}"
      per_thread[thread][e["name"]] += float(e.get("dur", 0.0)) / 1e3  # microseconds -> ms
      counts[thread][e["name"]] += 1
  out: dict[str, Any] = {"device_events": sum(sum(c.values()) for c in counts.values()),
                         "threads_ms": {t: round(sum(ms.values()), 3) for t, ms in per_thread.items()}}
  if not per_thread:
    return out
  main = max(per_thread, key=lambda t: len(per_thread[t]))
  ms = per_thread[main]
  by_kind: collections.Counter = collections.Counter()
  for name, t in ms.items():
    by_kind[kind_of(name)] += t
  total = sum(ms.values())
  out.update(thread=main, total_ms=round(total, 3),
             by_kind={k: {"ms": round(t, 3), "share": round(t / total, 4)} for k, t in by_kind.most_common()},
             top=[{"name": n, "ms": round(t, 3), "count": counts[main][n], "kind": kind_of(n)}
                  for n, t in ms.most_common(TOP)])
  return out


def read_trace(path: str | pathlib.Path) -> dict | list:
  path = pathlib.Path(path)
  raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
  return json.loads(raw)


def profile_step(step: Callable[[], Any]) -> dict[str, Any]:
  """`step()` once to compile, then once under the profiler; its summary (`summarize`). `step` must wait
  for its results (the learner's step returns host floats)."""
  import jax  # pylint: disable=import-outside-toplevel
  step()
  with tempfile.TemporaryDirectory(prefix="clawjax-profile-") as tmp:
    jax.profiler.start_trace(tmp, create_perfetto_trace=True)
    try:
      step()
    finally:
      jax.profiler.stop_trace()
    return summarize(read_trace(next(pathlib.Path(tmp).rglob("perfetto_trace.json.gz"))))


if __name__ == "__main__":
  print(json.dumps(summarize(read_trace(sys.argv[1])), indent=1))
