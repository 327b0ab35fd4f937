"""LiteLLM's proxy on the shim benchmark's request: the reference point of the shim's latency goal.

The shim's goal (added p50 <= 2 ms at 16 concurrent) cites LiteLLM at ~4 ms on tiny requests. This
measures LiteLLM on this machine with `shim_overhead.py`'s client, conversation and tool-time spacing,
in front of a fixed-latency OpenAI chat-completions stand-in (which records the request it got, so the
direct calls send exactly what LiteLLM sent). Three cases, each added latency = through LiteLLM - direct,
side by side in one run:
  messages   Anthropic /v1/messages, streamed, the Claude Code-sized 30th call (what a harness sends;
             LiteLLM translates it to an OpenAI chat request)
  chat       the same conversation on /v1/chat/completions (LiteLLM's passthrough)
  chat-tiny  one short message on /v1/chat/completions (LiteLLM's own benchmark case)
Also LiteLLM's CPU per call and its own `x-litellm-overhead-duration-ms` (handler start to end, less
the provider call: it leaves out the server before the handler).

LiteLLM is not a dependency of clawjax; install it into a venv of its own and pass its executable:
  python -m venv /tmp/litellm && /tmp/litellm/bin/pip install 'litellm[proxy]'
  python benchmarks/litellm_reference.py --litellm /tmp/litellm/bin/litellm --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np
import orjson
import uvloop

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shim_overhead as shim_bench  # pylint: disable=g-import-not-at-top,wrong-import-position

MODEL = "claude-sonnet-4"
CASES = ("messages", "chat", "chat-tiny")
_CALL = {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": json.dumps(
    {"command": "sed -n 1,200p src/module.py", "description": "Read module"})}}
_USAGE = {"prompt_tokens": 20000, "completion_tokens": 40, "total_tokens": 20040}


def serve_upstream(port: int, latency_s: float) -> None:
  """OpenAI chat completions: a text + tool-call turn after `latency_s`; GET /last is the last body."""
  from aiohttp import web
  last = {"body": b"{}"}

  def chunk(delta: dict | None, finish: str | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "policy",
           "choices": choices, **({"usage": _USAGE} if delta is None else {})}
    return b"data: " + orjson.dumps(obj) + b"\n\n"

  streamed = (chunk({"role": "assistant", "content": "Let me look at the next file."})
              + chunk({"tool_calls": [dict(_CALL, index=0)]}) + chunk({}, "tool_calls") + chunk(None)
              + b"data: [DONE]\n\n")
  whole = orjson.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "policy",
                        "usage": _USAGE, "choices": [{"index": 0, "finish_reason": "tool_calls",
                                                      "message": {"role": "assistant",
                                                                  "content": "Let me look at the next file.",
                                                                  "tool_calls": [_CALL]}}]})

  async def chat(request: web.Request) -> web.StreamResponse:
    last["body"] = await request.read()
    stream = orjson.loads(last["body"]).get("stream")
    await asyncio.sleep(latency_s)
    if not stream:
      return web.Response(body=whole, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(streamed)
    return response

  async def get_last(request: web.Request) -> web.Response:
    return web.Response(body=last["body"], content_type="application/json")

  shim_bench.serve_app(port, [("POST", "/v1/chat/completions", chat), ("GET", "/last", get_last)])


def claude_code_call(salt: str) -> dict:
  """The 30th call of shim_overhead's conversation: 29 tool rounds, a fresh tool result last."""
  body = shim_bench.first_request()
  for k in range(29):
    tool_id = f"toolu_{k:024d}"
    body["messages"] += [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look at the next file."},
            {"type": "tool_use", "id": tool_id, "name": "Bash",
             "input": {"command": f"sed -n 1,200p src/module_{k}.py", "description": "Read module"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id,
                                      "content": shim_bench.tool_result(k)}]}]
  body["messages"][-1]["content"][0]["content"] = shim_bench.tool_result(29, salt=salt)
  return body


def case_bodies(case: str, translated: dict):
  """salt -> the request body of `case` (`translated`: the chat request LiteLLM made of a messages call)."""
  if case == "messages":
    return "/v1/messages", lambda salt: orjson.dumps(claude_code_call(salt))
  if case == "chat":
    *head, last = translated["messages"]
    return "/v1/chat/completions", lambda salt: orjson.dumps(dict(
        translated, model=MODEL, messages=head + [dict(last, content=str(last["content"]) + salt)]))
  return "/v1/chat/completions", lambda salt: orjson.dumps(
      {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi" + salt}]})


async def post(session, url: str, data: bytes) -> tuple[float, float | None, bytes]:
  """(seconds, LiteLLM's own overhead header in ms if any, body)."""
  t = time.perf_counter()
  async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
    raw = await resp.read()
  if resp.status != 200:
    raise RuntimeError(f"{url} answered {resp.status}: {raw[:300]!r}")
  overhead = resp.headers.get("x-litellm-overhead-duration-ms")
  return time.perf_counter() - t, None if overhead is None else float(overhead), raw


async def worker(session, urls: dict[str, str], case: str, rounds: int, tool_s: float, seed: int,
                 out: dict, barrier: asyncio.Barrier, lock: asyncio.Lock) -> None:
  rng = random.Random(seed)

  async def upstream_last() -> bytes:
    async with session.get(urls["upstream"] + "/last") as resp:
      return await resp.read()

  async with lock:  # (The upstream keeps only the last request it got.)
    # LiteLLM's translation of a messages call is the "chat" case's conversation.
    await post(session, urls["litellm"] + "/v1/messages", orjson.dumps(claude_code_call("\n# warm-up")))
    path, body = case_bodies(case, orjson.loads(await upstream_last()))
    await post(session, urls["litellm"] + path, body("\n# warm-up"))
    direct = await upstream_last()  # What LiteLLM sent for this case: the direct calls replay it.
  out["body_bytes"] = len(body(""))
  await barrier.wait()
  for r in range(rounds):
    await asyncio.sleep(rng.uniform(0, tool_s))
    dt, overhead, _ = await post(session, urls["litellm"] + path, body(f"\n# round {seed} {r}"))
    out["litellm"].append(dt)
    out["overhead"].append(overhead)
    out["direct"].append((await post(session, urls["upstream"] + "/v1/chat/completions", direct))[0])


def process_tree_cpu(pid: int) -> float:
  """CPU seconds of `pid` and its descendants (the proxy may run its server in a child)."""
  children: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/stat", encoding="ascii") as fh:
          ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
      except OSError:
        continue
      children.setdefault(ppid, []).append(int(name))
  total, todo = 0.0, [pid]
  while todo:
    p = todo.pop()
    try:
      total += shim_bench.cpu_seconds(p)
    except OSError:
      pass
    todo += children.get(p, [])
  return total


async def measure(urls: dict[str, str], case: str, concurrency: int, rounds: int, tool_s: float,
                  litellm_pid: int) -> dict:
  outs = [{"litellm": [], "direct": [], "overhead": []} for _ in range(concurrency)]
  barrier, lock = asyncio.Barrier(concurrency), asyncio.Lock()
  async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                   timeout=aiohttp.ClientTimeout(total=600)) as session:
    tasks = [worker(session, urls, case, rounds, tool_s, seed, out, barrier, lock)
             for seed, out in enumerate(outs)]
    cpu = process_tree_cpu(litellm_pid)
    await asyncio.gather(*tasks)
    cpu = process_tree_cpu(litellm_pid) - cpu
  ms = {k: np.array([x for o in outs for x in o[k]]) * 1e3 for k in ("litellm", "direct")}
  pct = shim_bench.percentiles
  own = [x for o in outs for x in o["overhead"] if x is not None]
  return {"case": case, "concurrency": concurrency, "body_bytes": outs[0]["body_bytes"],
          "direct_ms": pct(ms["direct"]), "litellm_ms": pct(ms["litellm"]),
          "added_ms": {q: pct(ms["litellm"])[q] - pct(ms["direct"])[q] for q in ("p50", "p99")},
          "litellm_own_overhead_ms": pct(own) if own else None,
          # Warm-up calls included (two per rollout): an upper bound.
          "litellm_cpu_ms_per_call": cpu * 1e3 / (concurrency * (rounds + 2))}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--litellm", help="the `litellm` executable of a venv with litellm[proxy]")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
  p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
  p.add_argument("--rounds", type=int, default=30)
  p.add_argument("--engine-latency-s", type=float, default=0.05)
  p.add_argument("--tool-time-s", type=float, default=0.05)
  p.add_argument("--workers", type=int, default=1, help="LiteLLM's --num_workers (the shim is one process)")
  p.add_argument("--serve-upstream", type=int, default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.serve_upstream is not None:
    serve_upstream(args.serve_upstream, args.engine_latency_s)
    return
  if not args.litellm:
    p.error("--litellm is required")
  up_port, ll_port = shim_bench.free_port(), shim_bench.free_port()
  urls = {"upstream": f"http://127.0.0.1:{up_port}", "litellm": f"http://127.0.0.1:{ll_port}"}
  with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "config.yaml")
    with open(config, "w", encoding="utf-8") as fh:
      # hosted_vllm: an OpenAI-compatible server reached on /chat/completions (LiteLLM sends its
      # openai/ models' Anthropic-format calls to /responses instead).
      fh.write(f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n"
               f"      model: hosted_vllm/policy\n      api_base: {urls['upstream']}/v1\n"
               "      api_key: none\nlitellm_settings:\n  telemetry: false\n  drop_params: true\n"
               "  callbacks: []\n  num_retries: 0\n")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR",
               LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true")
    procs = {"upstream": subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port),
                                           "--engine-latency-s", str(args.engine_latency_s)]),
             "litellm": subprocess.Popen([args.litellm, "--config", config, "--port", str(ll_port),
                                          "--num_workers", str(args.workers)], env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)}
    try:
      asyncio.run(shim_bench.wait_up(urls["upstream"], procs["upstream"]))
      asyncio.run(shim_bench.wait_up(urls["litellm"], procs["litellm"], health_path="/health/liveliness"))
      for case in args.cases:  # Unmeasured: LiteLLM imports and builds much on its first calls.
        uvloop.run(measure(urls, case, 2, 2, args.tool_time_s, procs["litellm"].pid))
      results = [uvloop.run(measure(urls, case, c, args.rounds, args.tool_time_s, procs["litellm"].pid))
                 for case in args.cases for c in args.concurrency]
      version = subprocess.run([os.path.join(os.path.dirname(args.litellm), "python"), "-c",
                                "import importlib.metadata as m; print(m.version('litellm'))"],
                               capture_output=True, text=True, check=False).stdout.strip()
    finally:
      for proc in procs.values():
        proc.terminate()
        proc.wait()
  report = {"benchmark": "litellm_reference", "litellm_version": version, "workers": args.workers,
            "engine_latency_s": args.engine_latency_s, "tool_time_s": args.tool_time_s,
            "rounds": args.rounds, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
            "results": results}
  shim_bench.print_report(report, args.json, lambda r: (
      f"{r['case']:10s} C={r['concurrency']:3d}  added p50 {r['added_ms']['p50']:7.2f} ms  p99 "
      f"{r['added_ms']['p99']:7.2f} ms  own overhead p50 "
      f"{(r['litellm_own_overhead_ms'] or {'p50': float('nan')})['p50']:6.2f} ms  "
      f"CPU/call {r['litellm_cpu_ms_per_call']:6.2f} ms"))


if __name__ == "__main__":
  main()
