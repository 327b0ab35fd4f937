"""Shared helpers for the task tests: fixture paths, the official way of running reward.sh, and a
local OpenAI-compatible server standing in for the judge model."""
import asyncio
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest
from aiohttp import web

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "tasks"


def official_reward(task_dir: pathlib.Path, workspace: pathlib.Path, tmp: pathlib.Path) -> float:
  """What the task's own reward.sh prints, run the official way: reward/ copied into the finished
  workspace (here a copy of it) and reward.sh started from there; its last stdout line is the score."""
  run_dir = tmp / "official-run"
  shutil.rmtree(run_dir, ignore_errors=True)
  shutil.copytree(workspace, run_dir)
  shutil.copytree(task_dir / "reward", run_dir / "reward")
  # python3 resolves to this interpreter, as it does for the scorer by default.
  env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
  out = subprocess.run(["bash", "reward/reward.sh"], cwd=run_dir, capture_output=True, text=True,
                       check=True, timeout=60, env=env)
  return float(out.stdout.strip().splitlines()[-1])


class ScriptedJudge:
  """An OpenAI chat-completions endpoint answering from a script: a string is the reply's content,
  an int an HTTP error status. The last entry repeats. Requests are kept for inspection."""

  def __init__(self):
    self.replies: list[str | int] = ["{}"]
    self.requests: list[tuple[dict, dict]] = []
    self.url = ""

  async def handle(self, request: web.Request) -> web.Response:
    body = await request.json()
    self.requests.append((dict(request.headers), body))
    reply = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
    if isinstance(reply, int):
      return web.Response(status=reply, text="scripted failure")
    return web.json_response({
        "id": "chatcmpl-test", "object": "chat.completion", "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}]})


@pytest.fixture(scope="module")
def judge_server():
  judge = ScriptedJudge()
  loop = asyncio.new_event_loop()
  started = threading.Event()
  state = {}

  async def start():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", judge.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["runner"] = runner
    judge.url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"

  def serve():
    asyncio.set_event_loop(loop)
    loop.run_until_complete(start())
    started.set()
    loop.run_forever()

  thread = threading.Thread(target=serve, daemon=True)
  thread.start()
  assert started.wait(10)
  yield judge
  asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
  loop.call_soon_threadsafe(loop.stop)
  thread.join(10)


@pytest.fixture
def judge(judge_server):
  judge_server.replies = ["{}"]
  judge_server.requests.clear()
  return judge_server
