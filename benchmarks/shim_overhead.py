"""Added latency of the token-logging shim over calling the engine directly, side by side in one run.

Four processes: an engine speaking SGLang's native /generate (a fixed-latency stand-in that answers
with a scripted tool-call turn), the shim (`python -m clawjax.serving --backend sglang`, a real
subprocess with its real call log on disk), a bare hop (aiohttp on uvloop, like the shim, forwarding
the same engine request without any of the shim's work: the floor of a Python HTTP proxy), and this
client. For each concurrency level, C rollouts
are first played to their 29th call with a Claude Code-sized conversation (~75 KB body, ~20K-token
context, 12 tools); then each rollout repeatedly issues its 30th call (a fresh tool result each time,
so the new block is really tokenised) through the shim, then a direct /generate call of the same token
ids to the engine, then the same Messages call through the bare hop, and waits uniform(0,
--tool-time-s) for its "tool". Added latency = shim percentile - direct percentile. With --raw-hop
each round also calls a second bare hop that has no HTTP library (`raw_hop.py`), the floor under any
HTTP layer the shim could have.

With --incremental-stream the shim streams text as the engine samples it: the stand-in then sends one
event per token (SGLang's incremental mode), half its latency before the first token and the rest
spread over the turn, and direct calls stream the same way. Give it a realistic sampling time
(--engine-latency-s 0.5 is ~80 tokens/s for the ~40-token turn); at 50 ms the per-token events alone
overload two cores.

A change to the shim is measured against a variant shim: a second shim process, started with
--variant-flag and/or from the code at --variant-root (another checkout, e.g. `git worktree add`),
serves a second copy of each rollout, and every round calls both shims (alternating which goes first).
On this noisy 2-core machine run-to-run spread (1-3 ms at p50) hides sub-millisecond effects that such
interleaved calls show. `--variant-flag=--workers=N` measures a shim with N worker processes (a front
and N workers, `ShimConfig.workers`) beside the one-process shim: a process's CPU counts its workers'.
`added_p50_ms` sums up each shim's added p50 by concurrency, the figure that shows an event loop
saturating (at 128 against 16).

  python benchmarks/shim_overhead.py --json [--concurrency 1 16 128 --rounds 30]
  python benchmarks/shim_overhead.py --json --incremental-stream --engine-latency-s 0.5 --rounds 20
  python benchmarks/shim_overhead.py --concurrency 16 --variant-flag=--gc-threshold=0
  python benchmarks/shim_overhead.py --json --concurrency 1 16 --raw-hop
  python benchmarks/shim_overhead.py --concurrency 1 16 --variant-root ../clawjax-before
  python benchmarks/shim_overhead.py --json --concurrency 16 128 --rounds 5 --variant-flag=--workers=4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import aiohttp
import numpy as np
import orjson
import uvloop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from clawjax.calllog import load  # pylint: disable=g-import-not-at-top,wrong-import-position
from clawjax.environment import describe as describe_environment  # pylint: disable=wrong-import-position


def percentiles(a) -> dict[str, float]:
  """The p50 and p99 of a sample, as every report here gives them."""
  return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# ---- the engine stand-in and the bare hop (each in its own process: --serve-engine / --serve-hop)

def serve_engine(port: int, latency_s: float) -> None:
  from aiohttp import web
  from clawjax.serving.backends.scripted import ScriptTurn, scripted_logprob, turn_ids
  from clawjax.text.templates import load_template
  template = load_template("qwen3")
  replies: dict[int, tuple[bytes, list[bytes]]] = {}

  def reply(n: int) -> tuple[bytes, list[bytes]]:
    """A Claude Code-like tool call whose argument depends on the context length, so turns differ:
    the whole answer, and its stream events (one per token, as SGLang with
    --incremental-streaming-output and the default stream interval sends them). Kept per length: the
    stand-in's own CPU competes with the shim for the same cores."""
    if n not in replies:
      ids = turn_ids(template, ScriptTurn(text="Let me look at the next file.", tool_calls=(
          ("Bash", {"command": f"sed -n 1,200p src/module_{n}.py", "description": "Read module"}),)))
      triples = [[scripted_logprob(n + i, t), t, None] for i, t in enumerate(ids)]
      meta = lambda k, done: {"output_token_logprobs": triples[k - 1:k] if k else triples,
                              "finish_reason": {"type": "stop"} if done else None,
                              "prompt_tokens": n, "completion_tokens": k or len(ids)}
      whole = orjson.dumps({"output_ids": ids, "meta_info": meta(0, True)})
      events = [b"data: " + orjson.dumps({"output_ids": [t], "meta_info": meta(k, k == len(ids))})
                + b"\n\n" for k, t in enumerate(ids, 1)]
      replies[n] = whole, events + [b"data: [DONE]\n\n"]
    return replies[n]

  async def generate(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())  # Parsed like a real engine: this cost is in both paths.
    whole, events = reply(len(body["input_ids"]))
    if not body.get("stream"):
      await asyncio.sleep(latency_s)
      return web.Response(body=whole, content_type="application/json")
    # Half the time to the first token (prefill), the rest spread evenly over the tokens.
    start = time.monotonic()
    await asyncio.sleep(latency_s / 2)
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(request)
    for k, event in enumerate(events, 1):
      await asyncio.sleep(start + latency_s * (1 + k / len(events)) / 2 - time.monotonic())
      await stream.write(event)
    return stream

  serve_app(port, [("POST", "/generate", generate)])


def serve_hop(port: int, engine_url: str) -> None:
  """The floor: an HTTP hop built like the shim (aiohttp on uvloop) that does none of its work. It reads
  the Messages body, sends the engine the /generate request the client configured (the same bytes the
  direct calls send), reads the answer and streams back two fixed events."""
  from aiohttp import web
  state: dict[str, object] = {}
  events = (b'event: message_start\ndata: {"type":"message_start"}\n\n'
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n')

  async def configure(request: web.Request) -> web.Response:
    state["payload"] = await request.read()
    return web.json_response({})

  async def messages(request: web.Request) -> web.StreamResponse:
    if "session" not in state:
      state["session"] = aiohttp.ClientSession()
    await request.read()
    async with state["session"].post(engine_url + "/generate", data=state["payload"],
                                     headers={"Content-Type": "application/json"}) as resp:
      answer = await resp.read()
      if not answer.startswith(b"data:"):  # (A streamed answer is read whole, unparsed.)
        orjson.loads(answer)
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(request)
    await stream.write(events)
    return stream

  serve_app(port, [("POST", "/configure", configure), ("POST", "/v1/messages", messages)])


def serve_app(port: int, routes: list) -> None:
  from aiohttp import web

  async def health(request: web.Request) -> web.Response:
    return web.json_response({})

  async def serve() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    for method, path, handler in routes:
      app.router.add_route(method, path, handler)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()  # Until terminated.

  uvloop.run(serve())  # As SGLang's server (uvicorn) runs, and as the shim runs.


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


async def post_timed(session, url: str, data: bytes, headers: dict[str, str]) -> tuple[float, bytes]:
  t = time.perf_counter()
  async with session.post(url, data=data, headers=headers) as resp:
    raw = await resp.read()
  if resp.status != 200:
    raise RuntimeError(f"{url} answered {resp.status}: {raw[-300:]!r}")
  return time.perf_counter() - t, raw


_JSON = {"content-type": "application/json"}
ADMIN_TOKEN = "shim-overhead-benchmark"  # The shims' control routes (given them as $CLAWJAX_ADMIN_TOKEN).
_ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def direct_request(input_ids: list[int], stream: bool) -> bytes:
  """The /generate request the shim sends for `input_ids` (same fields, same sampling settings)."""
  return orjson.dumps({"input_ids": input_ids, "return_logprob": True,
                       "sampling_params": {"max_new_tokens": 8192, "temperature": 1.0,
                                           "top_p": 1.0, "top_k": -1,
                                           "stop_token_ids": [151645, 151643],
                                           "skip_special_tokens": False, "no_stop_trim": True},
                       **({"stream": True} if stream else {})})


@dataclasses.dataclass(frozen=True)
class Servers:
  shim: str
  engine: str
  hop: str
  incremental_stream: bool  # The shim streams tokens from the engine; direct calls stream too.
  variant: str | None = None  # A second shim (--variant-flag, --variant-root).
  raw_hop: str | None = None  # The hop without an HTTP library (--raw-hop).

  def shims(self) -> dict[str, str]:
    return {"shim": self.shim} | ({"variant": self.variant} if self.variant else {})

  def hops(self) -> dict[str, str]:
    return {"hop": self.hop} | ({"raw_hop": self.raw_hop} if self.raw_hop else {})


async def play_to_measured_call(session, shim_url: str, n_prior: int) -> tuple[dict, dict, dict]:
  """A new rollout on the shim at `shim_url`, played through calls 1..n_prior (echoing each turn back
  like Claude Code) and one unmeasured call n_prior + 1, whose logged prompt is what the direct calls
  (and the hop) send. Returns the rollout, its request body and the tool result block that each
  measured round rewrites."""
  async with session.post(shim_url + "/rollouts", json={"task_id": "bench", "harness": "claude-code"},
                          headers=_ADMIN) as resp:
    rollout = await resp.json()
  body = first_request()
  for k in range(n_prior):
    _, blocks = await call_shim(session, rollout, body)
    body["messages"].append({"role": "assistant", "content": blocks})
    body["messages"].append({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": b["id"], "content": tool_result(k)}
        for b in blocks if b["type"] == "tool_use"]})
  last = body["messages"][-1]["content"][0]
  last["content"] = tool_result(n_prior, salt="\n# warm-up")
  await call_shim(session, rollout, body, reassemble=False)
  return rollout, body, last


async def rollout_worker(session, urls: Servers, rounds, n_prior, out, barrier: asyncio.Barrier,
                         on_release, tool_s: float, seed: int) -> None:
  rng = random.Random(seed)
  played = {name: await play_to_measured_call(session, url, n_prior)
            for name, url in urls.shims().items()}
  rollout, body, _ = played["shim"]
  out["body_bytes"] = len(orjson.dumps(body))
  out["input_ids"] = _last_input_ids(rollout["log_path"])
  direct = direct_request(out["input_ids"], urls.incremental_stream)
  await post_timed(session, urls.engine + "/generate", direct, _JSON)
  for hop_url in urls.hops().values():
    await post_timed(session, hop_url + "/configure", direct, _JSON)
  if await barrier.wait() == 0:  # The measured calls of all rollouts start together.
    on_release()
  names = list(played)
  for r in range(rounds):
    # The harness runs the tool (also after the barrier: rollouts do not call in one burst).
    await asyncio.sleep(rng.uniform(0, tool_s))
    for name in names[r % len(names):] + names[:r % len(names)]:  # The two shims take turns first.
      rollout, body, last = played[name]
      last["content"] = tool_result(n_prior, salt=f"\n# round {r}")
      out[name].append((await call_shim(session, rollout, body, reassemble=False))[0])
    out["direct"].append((await post_timed(session, urls.engine + "/generate", direct, _JSON))[0])
    for name, hop_url in urls.hops().items():
      out[name].append((await post_timed(session, hop_url + "/v1/messages",
                                         orjson.dumps(played["shim"][1]), _JSON))[0])
  if await barrier.wait() == 0:
    on_release()
  for name, (rollout, _, _) in played.items():
    async with session.post(f"{urls.shims()[name]}/rollouts/{rollout['rollout_id']}/finish",
                            json={}, headers=_ADMIN) as resp:
      await resp.read()
    (records,) = load(rollout["log_path"]).calls.values()
    # Inside the shim: arrival to the record built (t_end, just before its fsync), less engine time.
    out[name + "_server"] += [r.t_end - r.t_start - r.extra["backend_s"]
                              for r in records[n_prior + 1:]]
    out[name + "_backend"] += [r.extra["backend_s"] for r in records[n_prior + 1:]]
  out["log_bytes"] = os.path.getsize(played["shim"][0]["log_path"])


def _last_input_ids(path: str) -> list[int]:
  (records,) = load(path).calls.values()
  return list(records[-1].input_ids)


def cpu_seconds(pid: int, descendants: bool = False) -> float:
  """CPU time of a process's live threads and, with `descendants`, of the processes it runs (a shim's
  workers), from Linux's /proc.

  Read from each thread's schedstat (nanoseconds): /proc/PID/stat counts in clock ticks (10 ms here), more
  than a few measured calls cost. A thread that exits between two readings drops out of the second; the
  servers measured here keep their threads.
  """
  own, children = 0, []
  for task in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as fh:
        own += int(fh.read().split()[0])
      if descendants:
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as fh:
          children += map(int, fh.read().split())
    except FileNotFoundError:  # The thread exited after the listing.
      continue
  return own * 1e-9 + sum(cpu_seconds(child, True) for child in children)


async def measure(urls: Servers, concurrency, rounds, n_prior, pids: dict[str, int],
                  tool_s: float) -> dict:
  series = ["direct", *urls.hops()] + [name + part for name in urls.shims() for part in ("", "_server",
                                                                                "_backend")]
  outs = [{k: [] for k in series} for _ in range(concurrency)]
  cpu_marks: list[dict[str, float]] = []  # CPU seconds by process, at the start and end of the rounds.
  barrier = asyncio.Barrier(concurrency)
  on_release = lambda: cpu_marks.append({name: cpu_seconds(pid, name in urls.shims())
                                         for name, pid in pids.items()})
  conn = aiohttp.TCPConnector(limit=0)
  async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=3600)) as s:
    await asyncio.gather(*(rollout_worker(s, urls, rounds, n_prior, o, barrier, on_release, tool_s,
                                          seed)
                           for seed, o in enumerate(outs)))
  # Per measured round (one call each through the shim(s), direct and through the hop), by process.
  cpu_ms_per_round = {name: (cpu_marks[1][name] - cpu_marks[0][name]) * 1e3 / (concurrency * rounds)
                      for name in pids}
  ms = {k: np.array([x for o in outs for x in o[k]]) * 1e3 for k in series}
  pct = {k: percentiles(a) for k, a in ms.items()}
  minus = lambda a, b: {q: pct[a][q] - pct[b][q] for q in ("p50", "p99")}
  result = {"concurrency": concurrency, "samples": len(ms["shim"]),
            "body_bytes": outs[0]["body_bytes"], "log_bytes_per_rollout": outs[0]["log_bytes"],
            "context_tokens": len(outs[0]["input_ids"]), "direct_ms": pct["direct"],
            "cpu_ms_per_round": cpu_ms_per_round}
  # The floors: what an aiohttp hop that does none of the shim's work adds, and one with no HTTP library.
  for name in urls.hops():
    result |= {f"{name}_ms": pct[name], f"{name}_added_ms": minus(name, "direct")}
  for name in urls.shims():  # "shim", and "variant" when there is one (its keys prefixed so).
    prefix = "" if name == "shim" else name + "_"
    result |= {f"{name}_ms": pct[name], f"{prefix}added_ms": minus(name, "direct"),
               f"{prefix}in_shim_before_fsync_ms": pct[name + "_server"],
               f"{prefix}engine_seen_by_shim_ms": pct[name + "_backend"],
               f"{name}_cpu_ms_per_call": cpu_ms_per_round[name]}
  return result


async def wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 120,
                  health_path: str = "/health") -> None:
  deadline = time.time() + timeout_s
  async with aiohttp.ClientSession() as s:
    while time.time() < deadline:
      if proc.poll() is not None:
        raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
      with contextlib.suppress(aiohttp.ClientError):
        async with s.get(url + health_path) as resp:
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
  p.add_argument("--incremental-stream", action="store_true",
                 help="run the shim with --incremental-stream: the engine streams each token as an "
                      "event (SGLang's incremental mode), the shim streams text on; direct calls then "
                      "stream too")
  p.add_argument("--shim-flag", action="append", default=[],
                 help="extra flag for the shim process, as one argument: --shim-flag=--log-threads=8")
  p.add_argument("--variant-flag", action="append", default=[],
                 help="runs a second shim with this extra flag (repeatable), measured side by side: "
                      "each rollout calls both in every round, alternating which goes first. Reported "
                      "as variant_*; e.g. --variant-flag=--gc-threshold=0")
  p.add_argument("--variant-root", default=None,
                 help="runs the variant shim from the clawjax code in this directory")
  p.add_argument("--raw-hop", action="store_true",
                 help="also measure a bare hop without an HTTP library (raw_hop.py) in every round")
  p.add_argument("--serve-engine", type=int, default=None, help=argparse.SUPPRESS)
  p.add_argument("--serve-hop", type=int, default=None, help=argparse.SUPPRESS)
  p.add_argument("--engine-url", default=None, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.serve_engine is not None:
    serve_engine(args.serve_engine, args.engine_latency_s)
    return
  if args.serve_hop is not None:
    serve_hop(args.serve_hop, args.engine_url)
    return
  if args.raw_hop and args.incremental_stream:
    p.error("--raw-hop reads whole answers only; it does not go with --incremental-stream")
  ports = {name: free_port() for name in ("shim", "engine", "hop", "variant", "raw_hop")}
  url = lambda name: f"http://127.0.0.1:{ports[name]}"
  variant = bool(args.variant_flag or args.variant_root)
  urls = Servers(url("shim"), url("engine"), url("hop"), args.incremental_stream,
                 url("variant") if variant else None, url("raw_hop") if args.raw_hop else None)
  env_for = lambda root: dict(os.environ, CLAWJAX_ADMIN_TOKEN=ADMIN_TOKEN,
                              PYTHONPATH=os.path.abspath(root) + os.pathsep
                              + os.environ.get("PYTHONPATH", ""))
  env = env_for(ROOT)
  with tempfile.TemporaryDirectory() as log_dir:
    shim = lambda name, flags, root=ROOT: subprocess.Popen(
        [sys.executable, "-m", "clawjax.serving", "--backend", "sglang", "--backend-url", urls.engine,
         "--model", "qwen3", "--port", str(ports[name]), "--log-dir", os.path.join(log_dir, name),
         "--max-context", "65536",
         "--incremental-stream" if args.incremental_stream else "--no-incremental-stream", *flags],
        env=env_for(root), stderr=subprocess.DEVNULL)
    procs = {
        "engine": subprocess.Popen([sys.executable, __file__, "--serve-engine", str(ports["engine"]),
                                    "--engine-latency-s", str(args.engine_latency_s)], env=env),
        "shim": shim("shim", args.shim_flag),
        "hop": subprocess.Popen([sys.executable, __file__, "--serve-hop", str(ports["hop"]),
                                 "--engine-url", urls.engine], env=env)}
    if variant:
      procs["variant"] = shim("variant", args.shim_flag + args.variant_flag,
                              args.variant_root or ROOT)
    if args.raw_hop:
      procs["raw_hop"] = subprocess.Popen(
          [sys.executable, os.path.join(ROOT, "benchmarks", "raw_hop.py"), str(ports["raw_hop"]),
           str(ports["engine"])], env=env)
    try:
      for name, proc in procs.items():
        asyncio.run(wait_up(url(name), proc))
      pids = {name: proc.pid for name, proc in procs.items()} | {"client": os.getpid()}
      # The client is on libuv too, as Node.js harnesses are.
      results = [uvloop.run(measure(urls, c, args.rounds, args.prior_calls, pids, args.tool_time_s))
                 for c in args.concurrency]
    finally:
      for proc in procs.values():
        proc.terminate()
        proc.wait()
  report = {"benchmark": "shim_overhead", "engine_latency_s": args.engine_latency_s,
            "incremental_stream": args.incremental_stream, "shim_flags": args.shim_flag,
            "variant_flags": args.variant_flag, "variant_root": args.variant_root,
            "raw_hop": args.raw_hop,
            "tool_time_s": args.tool_time_s,
            "load_average": os.getloadavg(),
            "rounds": args.rounds, "prior_calls": args.prior_calls, "cpus": os.cpu_count(),
            "results": results,
            "added_p50_ms": {name: {r["concurrency"]: r[("" if name == "shim" else name + "_") + "added_ms"]["p50"]
                                    for r in results} for name in urls.shims()},
            "goal": "added p50 <= 2 ms and p99 <= 10 ms at 16 concurrent; at 128 within 2x of that at 16"}
  print_report(report, args.json, lambda r: (
      f"C={r['concurrency']:4d}  direct p50 {r['direct_ms']['p50']:7.2f} ms  "
      f"shim p50 {r['shim_ms']['p50']:7.2f} ms  added p50 {r['added_ms']['p50']:6.2f} ms  "
      f"p99 {r['added_ms']['p99']:6.2f} ms  bare hop added p50 {r['hop_added_ms']['p50']:5.2f} "
      f"p99 {r['hop_added_ms']['p99']:5.2f} ms  in-shim p50 {r['in_shim_before_fsync_ms']['p50']:6.2f}"
      f" ms p99 {r['in_shim_before_fsync_ms']['p99']:6.2f} ms  "
      + (f"variant added p50 {r['variant_added_ms']['p50']:6.2f} ms p99 "
         f"{r['variant_added_ms']['p99']:6.2f} ms  " if "variant_ms" in r else "")
      + (f"raw hop added p50 {r['raw_hop_added_ms']['p50']:5.2f} ms  " if "raw_hop_ms" in r else "")
      + "CPU/round " + " ".join(f"{k} {v:5.2f}" for k, v in r["cpu_ms_per_round"].items()) + " ms"))


def print_report(report: dict, as_json: bool, line: Callable[[dict], str]) -> None:
  """The report as one JSON object, or one `line` per result."""
  print(json.dumps({**report, "environment": describe_environment()}, indent=1) if as_json
        else "\n".join(map(line, report["results"])))


if __name__ == "__main__":
  main()
