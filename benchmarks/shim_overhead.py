"""Added latency of the token-logging shim over calling the engine directly, side by side in one run.

Three processes: an engine speaking SGLang's native /generate (a fixed-latency stand-in that answers
with a scripted tool-call turn), the shim (`python -m clawjax.serving --backend sglang`, a real
subprocess with its real call log on disk), and this client. For each concurrency level, C rollouts
are first played to their 29th call with a Claude Code-sized conversation (~75 KB body, ~20K-token
context, 12 tools); then each rollout repeatedly issues its 30th call (a fresh tool result each time,
so the new block is really tokenised) through the shim, alternating with a direct /generate call of the
same token ids to the engine. Added latency = shim percentile - direct percentile.

  python benchmarks/shim_overhead.py --json [--concurrency 1 16 128 --rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np
import orjson
import uvloop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from clawjax.calllog import load  # pylint: disable=g-import-not-at-top,wrong-import-position


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ---- the engine stand-in (runs in its own process: --serve-engine PORT)

def serve_engine(port: int, latency_s: float) -> None:
  from aiohttp import web
  from clawjax.serving.backends.scripted import ScriptTurn, scripted_logprob, turn_ids
  from clawjax.text.templates import load_template
  template = load_template("qwen3")
  replies: dict[int, bytes] = {}

  def reply(n: int) -> bytes:
    """A Claude Code-like tool call whose argument depends on the context length, so turns differ.
    Kept per length: the stand-in's own CPU competes with the shim for the same cores."""
    if n not in replies:
      ids = turn_ids(template, ScriptTurn(text="Let me look at the next file.", tool_calls=(
          ("Bash", {"command": f"sed -n 1,200p src/module_{n}.py", "description": "Read module"}),)))
      replies[n] = orjson.dumps({"output_ids": ids, "meta_info": {
          "output_token_logprobs": [[scripted_logprob(n + i, t), t, None] for i, t in enumerate(ids)],
          "finish_reason": {"type": "stop"}, "prompt_tokens": n, "completion_tokens": len(ids)}})
    return replies[n]

  async def generate(request: web.Request) -> web.Response:
    body = orjson.loads(await request.read())  # Parsed like a real engine: this cost is in both paths.
    await asyncio.sleep(latency_s)
    return web.Response(body=reply(len(body["input_ids"])), content_type="application/json")

  async def health(request: web.Request) -> web.Response:
    return web.json_response({})

  async def serve() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # Until terminated.

  uvloop.run(serve())  # As SGLang's server (uvicorn) runs.


# ---- a Claude Code-sized conversation

def _tools() -> list[dict]:
  """12 tools, ~32K characters of schema, as Claude Code sends in -p mode."""
  tools = []
  for i, name in enumerate(["Bash", "Read", "Write", "Edit", "Glob", "Grep", "Task", "TodoWrite",
                            "WebFetch", "NotebookEdit", "BashOutput", "KillShell"]):
    props = {f"param_{j}": {"type": "string", "description": f"Parameter {j} of {name}. " * 6}
             for j in range(8)}
    tools.append({"name": name, "description": f"The {name} tool. " * 60,
                  "input_schema": {"type": "object", "properties": props, "required": ["param_0"]}})
  return tools


def _source(k: int, chars: int) -> str:
  lines, n = [], 0
  while n < chars:
    line = f"    value_{k}_{len(lines)} = compute(alpha={len(lines)}, beta='{k}')  # step {len(lines)}"
    lines.append(line)
    n += len(line) + 1
  return "\n".join(lines)


def first_request() -> dict:
  return {"model": "claude-sonnet-4", "max_tokens": 32000, "stream": True,
          "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI. " * 140}],
          "tools": _tools(), "thinking": {"type": "adaptive"}, "metadata": {"user_id": "bench"},
          "messages": [{"role": "user", "content": [{"type": "text", "text": "Refactor the project."}]},
                       {"role": "system", "content": "Environment: linux. " * 500}]}


def tool_result(k: int, salt: str = "") -> str:
  return _source(k, 700) + salt


# ---- the client

async def call_shim(session, rollout, body, reassemble: bool = True) -> tuple[float, list[dict]]:
  """Latency of one Messages call, and the turn's content blocks when `reassemble` (warm-up calls,
  whose turns are echoed back). The client's own JSON work is excluded, as for direct calls."""
  data = orjson.dumps(body)
  t = time.perf_counter()
  async with session.post(rollout["base_url"] + "/v1/messages?beta=true", data=data,
                          headers={"x-api-key": rollout["api_key"],
                                   "content-type": "application/json"}) as resp:
    raw = await resp.read()
  dt = time.perf_counter() - t
  if resp.status != 200 or b"message_stop" not in raw[-64:]:
    raise RuntimeError(f"shim answered {resp.status} without a complete stream: {raw[-300:]!r}")
  return dt, _reassemble(raw.decode()) if reassemble else []


def _reassemble(sse_text: str) -> list[dict]:
  """The assistant content blocks of an Anthropic SSE stream."""
  blocks: list[dict] = []
  partial = {}
  for line in sse_text.splitlines():
    if not line.startswith("data: "):
      continue
    ev = json.loads(line[6:])
    if ev["type"] == "content_block_start":
      blocks.append(dict(ev["content_block"]))
    elif ev["type"] == "content_block_delta":
      d, b = ev["delta"], blocks[ev["index"]]
      if d["type"] == "text_delta":
        b["text"] += d["text"]
      elif d["type"] == "thinking_delta":
        b["thinking"] += d["thinking"]
      elif d["type"] == "input_json_delta":
        partial[ev["index"]] = partial.get(ev["index"], "") + d["partial_json"]
  for i, js in partial.items():
    blocks[i]["input"] = json.loads(js)
  return blocks


async def call_direct(session, engine_url, data: bytes) -> float:
  t = time.perf_counter()
  async with session.post(engine_url + "/generate", data=data,
                          headers={"content-type": "application/json"}) as resp:
    await resp.read()
  if resp.status != 200:
    raise RuntimeError(f"engine answered {resp.status}")
  return time.perf_counter() - t


def direct_request(input_ids: list[int]) -> bytes:
  """The /generate request the shim sends for `input_ids` (same fields, same sampling settings)."""
  return orjson.dumps({"input_ids": input_ids, "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 8192, "temperature": 1.0,
                                           "top_p": 1.0, "top_k": -1,
                                           "stop_token_ids": [151645, 151643],
                                           "skip_special_tokens": False, "no_stop_trim": True}})


async def rollout_worker(session, shim_url, engine_url, rounds, n_prior, out,
                         barrier: asyncio.Barrier, on_release, tool_s: float, seed: int) -> None:
  rng = random.Random(seed)
  async with session.post(shim_url + "/rollouts", json={"task_id": "bench",
                                                        "harness": "claude-code"}) as resp:
    rollout = await resp.json()
  body = first_request()
  for k in range(n_prior):  # Calls 1..n_prior, echoing each turn back like Claude Code.
    _, blocks = await call_shim(session, rollout, body)
    body["messages"].append({"role": "assistant", "content": blocks})
    body["messages"].append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b["id"], "content": tool_result(k)}
        for b in blocks if b["type"] == "tool_use"]})
  last = body["messages"][-1]["content"][0]
  # One unmeasured 30th call: its logged prompt is what the direct calls send.
  last["content"] = tool_result(n_prior, salt="\n# warm-up")
  out["body_bytes"] = len(orjson.dumps(body))
  await call_shim(session, rollout, body, reassemble=False)
  out["input_ids"] = _last_input_ids(rollout["log_path"])
  direct = direct_request(out["input_ids"])
  await call_direct(session, engine_url, direct)
  if await barrier.wait() == 0:  # The measured calls of all rollouts start together.
    on_release()
  for r in range(rounds):
    # The harness runs the tool (also after the barrier: rollouts do not call in one burst).
    await asyncio.sleep(rng.uniform(0, tool_s))
    last["content"] = tool_result(n_prior, salt=f"\n# round {r}")
    dt, _ = await call_shim(session, rollout, body, reassemble=False)
    out["shim"].append(dt)
    out["direct"].append(await call_direct(session, engine_url, direct))
  if await barrier.wait() == 0:
    on_release()
  async with session.post(f"{shim_url}/rollouts/{rollout['rollout_id']}/finish", json={}) as resp:
    await resp.read()
  (records,) = load(rollout["log_path"]).calls.values()
  # Inside the shim: arrival to the record built (t_end, just before its fsync), less the engine time.
  out["server"] += [r.t_end - r.t_start - r.extra["backend_s"] for r in records[n_prior + 1:]]
  out["backend"] += [r.extra["backend_s"] for r in records[n_prior + 1:]]
  out["log_bytes"] = os.path.getsize(rollout["log_path"])
def _last_input_ids(path: str) -> list[int]:
  calls = load(path).calls
  (records,) = calls.values()
  return list(records[-1].input_ids)


def cpu_seconds(pid: int) -> float:
  """User + system CPU time of a process (Linux /proc)."""
  with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
    fields = fh.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(shim_url, engine_url, concurrency, rounds, n_prior, pids: dict[str, int],
                  tool_s: float) -> dict:
  outs = [{"shim": [], "direct": [], "server": [], "backend": []} for _ in range(concurrency)]
  cpu_marks: list[dict[str, float]] = []  # CPU seconds by process, at the start and end of the rounds.
  barrier = asyncio.Barrier(concurrency)
  on_release = lambda: cpu_marks.append({name: cpu_seconds(pid) for name, pid in pids.items()})
  conn = aiohttp.TCPConnector(limit=0)
  async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as s:
    await asyncio.gather(*(rollout_worker(s, shim_url, engine_url, rounds, n_prior, o, barrier,
                                          on_release, tool_s, seed)
                           for seed, o in enumerate(outs)))
  # Per measured round (one call through the shim, one direct call), by process: load-independent.
  cpu_ms_per_round = {name: (cpu_marks[1][name] - cpu_marks[0][name]) * 1e3 / (concurrency * rounds)
                      for name in pids}
  shim = np.array([x for o in outs for x in o["shim"]]) * 1e3
  direct = np.array([x for o in outs for x in o["direct"]]) * 1e3
  server = np.array([x for o in outs for x in o["server"]]) * 1e3
  backend = np.array([x for o in outs for x in o["backend"]]) * 1e3
  pct = lambda a, q: float(np.percentile(a, q))
  return {"concurrency": concurrency, "samples": len(shim), "body_bytes": outs[0]["body_bytes"],
          "log_bytes_per_rollout": outs[0]["log_bytes"],
          "context_tokens": len(outs[0]["input_ids"]),
          "direct_ms": {"p50": pct(direct, 50), "p99": pct(direct, 99)},
          "shim_ms": {"p50": pct(shim, 50), "p99": pct(shim, 99)},
          "added_ms": {"p50": pct(shim, 50) - pct(direct, 50), "p99": pct(shim, 99) - pct(direct, 99)},
          "in_shim_before_fsync_ms": {"p50": pct(server, 50), "p99": pct(server, 99)},
          "engine_seen_by_shim_ms": {"p50": pct(backend, 50), "p99": pct(backend, 99)},
          "shim_cpu_ms_per_call": cpu_ms_per_round["shim"], "cpu_ms_per_round": cpu_ms_per_round}


async def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
  deadline = time.time() + timeout_s
  async with aiohttp.ClientSession() as s:
    while time.time() < deadline:
      if proc.poll() is not None:
        raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
      with contextlib.suppress(aiohttp.ClientError):
        async with s.get(url + "/health") as resp:
          if resp.status == 200:
            return
      await asyncio.sleep(0.2)
  raise RuntimeError(f"{url} did not come up in {timeout_s} s")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 128])
  p.add_argument("--rounds", type=int, default=30, help="measured 30th calls per rollout")
  p.add_argument("--prior-calls", type=int, default=29, help="calls before the measured one")
  p.add_argument("--engine-latency-s", type=float, default=0.05, help="stand-in generation time")
  p.add_argument("--tool-time-s", type=float, default=0.05,
                 help="each rollout waits uniform(0, this) between rounds, as a harness runs its tool; "
                      "0 keeps all rollouts in lockstep (every call arrives in one burst)")
  p.add_argument("--serve-engine", type=int, default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.serve_engine is not None:
    serve_engine(args.serve_engine, args.engine_latency_s)
    return
  engine_port, shim_port = free_port(), free_port()
  engine_url, shim_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{shim_port}"
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  with tempfile.TemporaryDirectory() as log_dir:
    engine = subprocess.Popen([sys.executable, __file__, "--serve-engine", str(engine_port),
                               "--engine-latency-s", str(args.engine_latency_s)], env=env)
    shim = subprocess.Popen([sys.executable, "-m", "clawjax.serving", "--backend", "sglang",
                             "--backend-url", engine_url, "--model", "qwen3", "--port", str(shim_port),
                             "--log-dir", log_dir, "--max-context", "65536"], env=env,
                            stderr=subprocess.DEVNULL)
    try:
      asyncio.run(wait_up(engine_url, engine))
      asyncio.run(wait_up(shim_url, shim))
      pids = {"shim": shim.pid, "engine": engine.pid, "client": os.getpid()}
      # The client is on libuv too, as Node.js harnesses are.
      results = [uvloop.run(measure(shim_url, engine_url, c, args.rounds, args.prior_calls, pids,
                                    args.tool_time_s))
                 for c in args.concurrency]
    finally:
      for proc in (shim, engine):
        proc.terminate()
        proc.wait()
  report = {"benchmark": "shim_overhead", "engine_latency_s": args.engine_latency_s,
            "tool_time_s": args.tool_time_s,
            "load_average": os.getloadavg(),
            "rounds": args.rounds, "prior_calls": args.prior_calls, "cpus": os.cpu_count(),
            "results": results, "goal": "added p50 <= 2 ms and p99 <= 10 ms at 16 concurrent"}
  if args.json:
    print(json.dumps(report, indent=1))
  else:
    for r in results:
      inside = r["in_shim_before_fsync_ms"]
      print(f"C={r['concurrency']:4d}  direct p50 {r['direct_ms']['p50']:7.2f} ms  "
            f"shim p50 {r['shim_ms']['p50']:7.2f} ms  added p50 {r['added_ms']['p50']:6.2f} ms  "
            f"p99 {r['added_ms']['p99']:6.2f} ms  in-shim p50 {inside['p50']:6.2f} ms "
            f"p99 {inside['p99']:6.2f} ms  CPU/round " + " ".join(
                f"{k} {v:5.2f}" for k, v in r["cpu_ms_per_round"].items()) + " ms")


if __name__ == "__main__":
  main()
