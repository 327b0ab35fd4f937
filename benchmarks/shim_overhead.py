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
import socket
import subprocess
import sys
import tempfile
import time

import aiohttp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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

  async def generate(request: web.Request) -> web.Response:
    body = await request.json()
    await asyncio.sleep(latency_s)
    n = len(body["input_ids"])
    # A Claude Code-like tool call whose argument depends on the context, so turns differ.
    ids = turn_ids(template, ScriptTurn(text="Let me look at the next file.", tool_calls=(
        ("Bash", {"command": f"sed -n 1,200p src/module_{n}.py", "description": "Read module"}),)))
    return web.json_response({"output_ids": ids, "meta_info": {
        "output_token_logprobs": [[scripted_logprob(n + i, t), t, None] for i, t in enumerate(ids)],
        "finish_reason": {"type": "stop"}, "prompt_tokens": n, "completion_tokens": len(ids)}})

  async def health(request: web.Request) -> web.Response:
    return web.json_response({})

  app = web.Application(client_max_size=64 * 1024 * 1024)
  app.router.add_post("/generate", generate)
  app.router.add_get("/health", health)
  web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


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

async def call_shim(session, rollout, body) -> tuple[float, dict]:
  """Latency of one Messages call (the client's own JSON encoding excluded, as for direct calls)."""
  data = json.dumps(body).encode()
  t = time.perf_counter()
  async with session.post(rollout["base_url"] + "/v1/messages?beta=true", data=data,
                          headers={"x-api-key": rollout["api_key"],
                                   "content-type": "application/json"}) as resp:
    text = await resp.text()
    if resp.status != 200:
      raise RuntimeError(f"shim answered {resp.status}: {text[:300]}")
  dt = time.perf_counter() - t
  blocks = _reassemble(text)
  return dt, blocks


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


async def call_direct(session, engine_url, input_ids) -> float:
  payload = {"input_ids": input_ids, "return_logprob": True,
             "sampling_params": {"max_new_tokens": 8192, "temperature": 1.0,
                                 "stop_token_ids": [151645, 151643]}}
  data = json.dumps(payload).encode()
  t = time.perf_counter()
  async with session.post(engine_url + "/generate", data=data,
                          headers={"content-type": "application/json"}) as resp:
    await resp.json()
  return time.perf_counter() - t


async def rollout_worker(session, shim_url, engine_url, rounds, n_prior, out, warm) -> None:
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
  out["body_bytes"] = len(json.dumps(body))
  await warm()
  for r in range(rounds):
    last["content"] = tool_result(n_prior, salt=f"\n# round {r}")
    dt, _ = await call_shim(session, rollout, body)
    out["shim"].append(dt)
    if "input_ids" not in out:
      out["input_ids"] = _last_input_ids(rollout["log_path"])
    out["direct"].append(await call_direct(session, engine_url, out["input_ids"]))
  async with session.post(f"{shim_url}/rollouts/{rollout['rollout_id']}/finish", json={}) as resp:
    await resp.read()
  with open(rollout["log_path"], encoding="utf-8") as fh:
    records = [json.loads(line) for line in fh][n_prior:]
  # Inside the shim: arrival to the record built (t_end, just before its fsync), less the engine time.
  out["server"] += [r["t_end"] - r["t_start"] - r["extra"]["backend_s"] for r in records]
  out["backend"] += [r["extra"]["backend_s"] for r in records]


def _last_input_ids(path: str) -> list[int]:
  with open(path, encoding="utf-8") as fh:
    return json.loads(fh.readlines()[-1])["input_ids"]


def cpu_seconds(pid: int) -> float:
  """User + system CPU time of a process (Linux /proc)."""
  with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
    fields = fh.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(shim_url, engine_url, concurrency, rounds, n_prior, shim_pid) -> dict:
  outs = [{"shim": [], "direct": [], "server": [], "backend": []} for _ in range(concurrency)]
  warmed, all_warm, cpu = [0], asyncio.Event(), {}

  async def warm():
    """A barrier: the measured calls start together, after every rollout's warm-up."""
    warmed[0] += 1
    if warmed[0] == concurrency:
      cpu["start"] = cpu_seconds(shim_pid)
      all_warm.set()
    await all_warm.wait()

  conn = aiohttp.TCPConnector(limit=0)
  async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as s:
    await asyncio.gather(*(rollout_worker(s, shim_url, engine_url, rounds, n_prior, o, warm)
                           for o in outs))
  # Includes the finish calls (cheap); excludes warm-up. Load-independent: CPU, not wall time.
  cpu_ms_per_call = (cpu_seconds(shim_pid) - cpu["start"]) * 1e3 / (concurrency * rounds)
  shim = np.array([x for o in outs for x in o["shim"]]) * 1e3
  direct = np.array([x for o in outs for x in o["direct"]]) * 1e3
  server = np.array([x for o in outs for x in o["server"]]) * 1e3
  backend = np.array([x for o in outs for x in o["backend"]]) * 1e3
  pct = lambda a, q: float(np.percentile(a, q))
  return {"concurrency": concurrency, "samples": len(shim), "body_bytes": outs[0]["body_bytes"],
          "context_tokens": len(outs[0]["input_ids"]),
          "direct_ms": {"p50": pct(direct, 50), "p99": pct(direct, 99)},
          "shim_ms": {"p50": pct(shim, 50), "p99": pct(shim, 99)},
          "added_ms": {"p50": pct(shim, 50) - pct(direct, 50), "p99": pct(shim, 99) - pct(direct, 99)},
          "in_shim_before_fsync_ms": {"p50": pct(server, 50), "p99": pct(server, 99)},
          "engine_seen_by_shim_ms": {"p50": pct(backend, 50), "p99": pct(backend, 99)},
          "shim_cpu_ms_per_call": cpu_ms_per_call}


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
      results = [asyncio.run(measure(shim_url, engine_url, c, args.rounds, args.prior_calls,
                                         shim.pid))
                 for c in args.concurrency]
    finally:
      for proc in (shim, engine):
        proc.terminate()
        proc.wait()
  report = {"benchmark": "shim_overhead", "engine_latency_s": args.engine_latency_s,
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
            f"p99 {inside['p99']:6.2f} ms  shim CPU/call {r['shim_cpu_ms_per_call']:5.2f} ms")


if __name__ == "__main__":
  main()
