"""Routed experts through a router: the real router binaries in front of `python -m clawjax.engine`
(SGLang's protocol, a toy MoE recording routes). SGLang's model gateway (`smg`, sglang-router's successor)
forwards `return_routed_experts` and `routed_experts_start_len` to the worker, so the `sglang` backend
gets the routes from the positions it asked for, as from the worker itself. The pinned sglang-router
0.3.2 rebuilds every /generate body from its own struct and drops both fields: its worker never captures
routes, and the backend's generation comes without them (nothing fails)."""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import time

import numpy as np
import pytest

from clawjax.generation import SamplingParams
from clawjax.server_process import free_port, running
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend

ROUTERS = {"smg": [sys.executable, "-m", "smg", "launch"],
           "sglang_router": [sys.executable, "-m", "sglang_router.launch_router"]}
PROMPT = list(range(3, 40))
PARAMS = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)


def _generate(url: str, routes_from: int, wait_s: float = 0.0):
  """The `sglang` backend's generation of PROMPT asking for routes from `routes_from`, retried for up to
  `wait_s` while the router has no worker ready yet (it registers them after its own /health answers)."""
  async def run():
    backend = create_backend("sglang", url=url, model="test-tiny-moe", routed_experts=2)
    deadline = time.monotonic() + wait_s
    try:
      while True:
        try:
          return await backend.generate(PromptIds(PROMPT, routing_key="rollout-1", routes_from=routes_from), PARAMS)
        except BackendError:
          if time.monotonic() > deadline:
            raise
          await asyncio.sleep(1.0)
    finally:
      await backend.close()

  return asyncio.run(run())


@pytest.mark.slow
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_routes_through_the_router(router):
  if importlib.util.find_spec(router) is None:
    pytest.skip(f"{router} is not installed (the test extra installs it)")
  worker, port = free_port(), free_port()
  engine = [sys.executable, "-m", "clawjax.engine", "--model", "test-tiny-moe", "--port", str(worker),
            "--max-slots", "2", "--max-seq-len", "256", "--enable-return-routed-experts"]
  argv = [*ROUTERS[router], "--host", "127.0.0.1", "--port", str(port), "--policy", "manual", "--worker-urls",
          f"http://127.0.0.1:{worker}", "--prometheus-port", str(free_port()), "--log-level", "warn"]
  with running(engine, f"http://127.0.0.1:{worker}/health"), running(argv, f"http://127.0.0.1:{port}/health"):
    direct = _generate(f"http://127.0.0.1:{worker}", 0)
    whole, tail = (_generate(f"http://127.0.0.1:{port}", start, wait_s=90.0) for start in (0, 30))
  computed = len(PROMPT) + len(direct.output_ids) - 1
  assert direct.routed_experts.start == 0 and direct.routed_experts.end == computed
  assert whole.output_ids == tail.output_ids == direct.output_ids  # (the same seed)
  if router == "sglang_router":
    assert whole.routed_experts is None and tail.routed_experts is None
    return
  assert np.array_equal(whole.routed_experts.full(), direct.routed_experts.full())
  assert tail.routed_experts.start == 30 and np.array_equal(tail.routed_experts.full(), direct.routed_experts.full()[30:])
