r"""Prefix-cache hit rate of two engine replicas behind SGLang's router, with and without the shim's
routing key, measured side by side in one run.

  python benchmarks/router_prefix_cache.py --json [--rollouts 8] [--calls 4] [--max-slots 8]

Two engine servers (`python -m clawjax.engine --model test-tiny`, SGLang's protocol) sit behind the real
router (`python -m sglang_router.launch_router`, PyPI `sglang-router`), once with `--policy manual`,
which routes by the key the shim sends with every call (`x-smg-routing-key`: the rollout id), and once
with `--policy round_robin`, which ignores it. Each policy gets the same workload through a shim with
the `sglang` backend: `--rollouts` agent-like conversations at once, `--calls` calls each, every call
the previous context plus the model's reply and a tool result (the official `openai` SDK). A call's
prefix is cached where its rollout's previous call ran; the engines report `cached_tokens` per call and
the shim logs it. Prints {"manual": {...}, "round_robin": {...}}: per policy the hit rate (cached prompt
tokens / prompt tokens over the second and later calls of each rollout, where a cache can hit),
calls, and the p50 seconds of those calls.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import threading
import urllib.request

import numpy as np
import openai

from clawjax.auth import ADMIN_TOKEN_ENV
from clawjax.calllog import load
from clawjax.environment import describe as describe_environment
from clawjax.serving.backends.base import create_backend
from clawjax.server_process import free_port, running
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.text.templates import load_template

TOKEN = "benchmark-admin-token"


def _process(argv: list[str], ready_url: str):
  return running(argv, ready_url, env={ADMIN_TOKEN_ENV: TOKEN})


def _engine(port: int, max_slots: int):
  return _process([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port),
                   "--max-slots", str(max_slots), "--max-seq-len", "4096"], f"http://127.0.0.1:{port}/health")


def _router(port: int, workers: list[str], policy: str):
  # (Its Prometheus exporter takes a port of its own: a free one, so that runs never collide.)
  return _process([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port",
                   str(port), "--policy", policy, "--worker-urls", *workers, "--log-level", "warn",
                   "--prometheus-port", str(free_port())], f"http://127.0.0.1:{port}/health")


def _conversation(client: openai.OpenAI, k: int, calls: int) -> None:
  """An agent-like rollout: the same long system prompt, then a tool loop that grows the context."""
  messages = [{"role": "system", "content": "You are a coding agent. " + "Follow the rules. " * 120},
              {"role": "user", "content": f"Task {k}: fix the failing test in module_{k}.py."}]
  for i in range(calls):
    reply = client.chat.completions.create(model="policy", messages=messages)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or "ok"})
    messages.append({"role": "user", "content": f"Tool result {i}: " + f"line {k}.{i} " * 30})


def run_policy(policy: str, engines: list[str], rollouts: int, calls: int, log_dir: pathlib.Path) -> dict:
  port = free_port()
  with _router(port, engines, policy):
    backend = create_backend("sglang", url=f"http://127.0.0.1:{port}", model="qwen3")
    config = ShimConfig(log_dir=str(log_dir), max_new_tokens=8, max_context=4096, temperature=1.0)
    with ShimThread(config, backend, load_template("qwen3")) as shim:
      created = [shim.create_rollout(f"t{k}", "mini") for k in range(rollouts)]
      threads = [threading.Thread(target=_conversation, args=(
          openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0), k, calls))
                 for k, r in enumerate(created)]
      for t in threads:
        t.start()
      for t in threads:
        t.join()
      for r in created:
        shim.finish_rollout(r["rollout_id"])
  later = [c for cs in load(log_dir).calls.values() for c in cs if c.call_index > 0 and c.status == "ok"]
  prompt = sum(len(c.input_ids) for c in later)
  cached = sum(c.extra.get("cached_tokens", 0) for c in later)
  return {"hit_rate": round(cached / max(prompt, 1), 4), "calls": len(later),
          "prompt_tokens": prompt, "cached_tokens": cached,
          "p50_s": round(float(np.median([c.t_end - c.t_start for c in later])), 4) if later else None}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rollouts", type=int, default=8)
  parser.add_argument("--calls", type=int, default=4)
  parser.add_argument("--max-slots", type=int, default=8, help="KV slots per engine (prefixes it keeps)")
  parser.add_argument("--json", action="store_true")
  args = parser.parse_args(argv)
  ports = [free_port(), free_port()]
  engines = [f"http://127.0.0.1:{p}" for p in ports]
  report: dict = {"rollouts": args.rollouts, "calls": args.calls, "replicas": 2}
  with tempfile.TemporaryDirectory() as tmp, _engine(ports[0], args.max_slots), _engine(ports[1], args.max_slots):
    for policy in ("manual", "round_robin"):
      # Cold engines for each policy: the other policy's prefixes must not help it.
      for url in engines:
        req = urllib.request.Request(url + "/flush_cache", method="POST", headers={"Authorization": f"Bearer {TOKEN}"})
        urllib.request.urlopen(req, timeout=30).read()
      report[policy] = run_policy(policy, engines, args.rollouts, args.calls, pathlib.Path(tmp) / policy)
  report["environment"] = describe_environment()
  print(json.dumps(report, indent=None if args.json else 2))
  return report


if __name__ == "__main__":
  main()
