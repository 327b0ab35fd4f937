"""The SGLang-protocol server, through a plain HTTP client and through the shim's `sglang` backend."""

import asyncio
import dataclasses
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from aiohttp import web

from clawjax.engine.engine import Engine
from clawjax.models.loading import load_weights
from clawjax.engine.server import SGLANG_DEFAULT_MAX_NEW_TOKENS, EngineServer, parse_sampling
from clawjax.generation import SamplingParams
from clawjax.models import hf_io
from clawjax.serving.backends.base import BackendError, PromptIds, create_backend
from tests.engine.conftest import SMALL, learner_logprobs, prompt, tiny_model
from tests.ports import free_port

EOS = 7  # the served model's EOS id in these tests
TOKEN = "the-trainers-admin-token"


def http(url: str, body=None, token=None) -> tuple[int, object]:
  headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
  req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), headers=headers)
  try:
    with urllib.request.urlopen(req, timeout=120) as resp:
      status, raw = resp.status, resp.read()
  except urllib.error.HTTPError as e:
    status, raw = e.code, e.read()
  try:
    return status, json.loads(raw)
  except ValueError:
    return status, raw.decode()


async def with_server(model, fn):
  engine = Engine(model, SMALL)
  server = EngineServer(engine, "test-tiny-vocab",
                        lambda path, version: engine.update_from_model(load_weights(path, model), version),
                        eos_token_id=EOS, admin_token=TOKEN)
  runner = web.AppRunner(server.app)
  await runner.setup()
  site = web.TCPSite(runner, "127.0.0.1", 0)
  await site.start()
  port = site._server.sockets[0].getsockname()[1]
  try:
    return await fn(f"http://127.0.0.1:{port}", engine)
  finally:
    await runner.cleanup()
    engine.close()


def test_plain_http_round_trip(model, tmp_path):
  other = tiny_model(3)
  hf_io.save(other, tmp_path / "v1")
  ids = prompt(21, 30)
  body = {"input_ids": ids, "return_logprob": True,
          "sampling_params": {"max_new_tokens": 12, "temperature": 0.8, "sampling_seed": 5, "ignore_eos": True}}

  async def scenario(url, engine):
    call = lambda path, b=None, token=TOKEN: asyncio.to_thread(http, url + path, b, token)
    assert (await call("/health"))[0] == 200
    status, out = await call("/generate", body)
    assert status == 200, out
    meta = out["meta_info"]
    assert out["output_ids"] == [t for _, t, _ in meta["output_token_logprobs"]]
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    # Before an update names a version the server reports SGLang's "default" (no version).
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["weight_version"]) == (30, 12, "default")
    np.testing.assert_allclose([lp for lp, _, _ in meta["output_token_logprobs"]],
                               learner_logprobs(model, ids, out["output_ids"], 0.8), atol=1e-4)
    # Streamed: an event per token, the last one also finishing, as SGLang's incremental stream; every
    # event carries the request's one id, and ids are drawn one per request.
    status, text = await call("/generate", dict(body, stream=True))
    events = [json.loads(line[6:]) for line in text.split("\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert status == 200 and len(events) == 12
    assert [e["output_ids"] for e in events] == [[t] for t in out["output_ids"]]
    assert [e["meta_info"]["finish_reason"] for e in events] == [None] * 11 + [meta["finish_reason"]]
    assert {e["meta_info"]["id"] for e in events} == {f"clawjax-{int(meta['id'][8:]) + 1}"}
    assert (await call("/generate", body))[1]["meta_info"]["id"] == f"clawjax-{int(meta['id'][8:]) + 2}"
    # Same request in-process: the server adds nothing to the sampling.
    direct = await engine.generate(ids, SamplingParams(max_new_tokens=12, temperature=0.8, seed=5))
    assert list(direct.output_ids) == out["output_ids"]
    # A batch of two prompts answers a list; EOS stops by default and is reported as matched.
    status, outs = await call("/generate", {"input_ids": [ids, ids[:5]],
                                            "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    assert status == 200 and len(outs) == 2 and "output_token_logprobs" not in outs[0]["meta_info"]
    # The control routes need the admin token: 401 without, 403 with another; they do nothing then.
    for path, b in [("/flush_cache", None), ("/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})]:
      assert (await call(path, b, None))[0] == 401 and (await call(path, b, "sk-guess"))[0] == 403
    assert (await call("/flush_cache"))[0] == 200
    info = (await call("/model_info"))[1]
    assert info["is_generation"] and info["weight_version"] == "default"
    assert (await call("/get_model_info"))[1] == info  # SGLang's deprecated name, for older clients
    version = lambda: call("/model_info")
    # An update without a version keeps the one of the weights it replaces, as SGLang does.
    status, up = await call("/update_weights_from_disk", {"model_path": str(tmp_path / "v1")})
    assert status == 200 and up == {"success": True, "message": "Succeeded to update model weights.",
                                    "num_paused_requests": 0}
    assert (await version())[1]["weight_version"] == "default"
    status, out1 = await call("/generate", body)
    assert out1["meta_info"]["weight_version"] == "default" and out1["output_ids"] != out["output_ids"]
    np.testing.assert_allclose([lp for lp, _, _ in out1["meta_info"]["output_token_logprobs"]],
                               learner_logprobs(other, ids, out1["output_ids"], 0.8), atol=1e-4)
    status, bad = await call("/update_weights_from_disk", {"model_path": str(tmp_path / "missing")})
    assert status == 400 and not bad["success"] and (await version())[1]["weight_version"] == "default"
    # A trainer names the version (SGLang's string field): it is what every answer reports next.
    status, up = await call("/update_weights_from_disk", {"model_path": str(tmp_path / "v1"), "weight_version": "7"})
    assert status == 200 and up["message"].endswith("Weight version updated to 7.")
    assert (await version())[1]["weight_version"] == "7"
    assert (await call("/generate", body))[1]["meta_info"]["weight_version"] == "7"
    # Not a string: refused, as SGLang's request model refuses it (422).
    status, bad = await call("/update_weights_from_disk", {"model_path": str(tmp_path / "v1"), "weight_version": 8})
    assert status == 422 and (await version())[1]["weight_version"] == "7"
    # The same version again (a resumed trainer's first push), a lower one (a trainer resumed from a
    # checkpoint older than the weights the server holds), any string: taken, as SGLang takes any version.
    for named in ("7", "6", "seven"):
      status, up = await call("/update_weights_from_disk", {"model_path": str(tmp_path / "v1"), "weight_version": named})
      assert status == 200 and (await version())[1]["weight_version"] == named
      assert (await call("/generate", body))[1]["meta_info"]["weight_version"] == named
    status, err = await call("/generate", {"input_ids": ids, "sampling_params": {"temperature": "hot"}})
    assert status == 400 and "sampling_params.temperature" in err["error"]["message"]
    status, err = await call("/generate", {"text": "hello"})
    assert status == 400 and "input_ids" in err["error"]["message"]
    status, err = await call("/generate", {"input_ids": [ids, ids], "stream": True})
    assert status == 400 and "one prompt" in err["error"]["message"]

  asyncio.run(with_server(model, scenario))


def test_eos_is_a_stop_token_unless_ignored():
  assert parse_sampling({"sampling_params": {"stop_token_ids": [3]}}, eos_token_id=EOS).stop_token_ids == (3, EOS)
  assert parse_sampling({"sampling_params": {"ignore_eos": True}}, eos_token_id=EOS).stop_token_ids == ()
  assert parse_sampling({}, eos_token_id=None).max_new_tokens == SGLANG_DEFAULT_MAX_NEW_TOKENS


def test_stop_token_finish_reason_names_the_match(model):
  ids = prompt(22, 10)

  async def scenario(url, engine):
    free = await engine.generate(ids, SamplingParams(max_new_tokens=8, temperature=0.0))
    stop = free.output_ids[2]
    status, out = await asyncio.to_thread(http, url + "/generate", {
        "input_ids": ids, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "stop_token_ids": [stop],
                                              "ignore_eos": True}})
    assert status == 200
    assert out["output_ids"] == list(free.output_ids[:free.output_ids.index(stop) + 1])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}

  asyncio.run(with_server(model, scenario))


def test_shim_sglang_backend_client_round_trip(model, tmp_path):
  ids = prompt(23, 25)
  same = str(hf_io.save(model, tmp_path / "same"))

  async def scenario(url, engine):
    backend = create_backend("sglang", url=url, admin_api_key=TOKEN)
    keyless = create_backend("sglang", url=url)
    try:
      gen = await backend.generate(PromptIds(ids), SamplingParams(max_new_tokens=6, temperature=1.0, seed=9))
      direct = await engine.generate(ids, SamplingParams(max_new_tokens=6, temperature=1.0, seed=9,
                                                   stop_token_ids=(EOS,)))
      assert gen.output_ids == direct.output_ids and gen.policy_version is None  # "default": no version
      np.testing.assert_allclose(gen.output_logprobs, direct.output_logprobs, atol=1e-6)
      # Streamed (the shim's --incremental-stream): an event per token, then the finish; the prompt was
      # seen before, so the engine reports its prefix as cached.
      got = []
      streamed = await backend.generate_streaming(
          PromptIds(ids), SamplingParams(max_new_tokens=6, temperature=1.0, seed=9), got.append)
      assert gen.cached_tokens == 0 and streamed.cached_tokens > 0
      assert dataclasses.replace(streamed, cached_tokens=0) == gen and got == [[t] for t in gen.output_ids]
      assert await backend.health()
      with pytest.raises(BackendError, match="HTTP 401"):
        await keyless.update_weights_from_disk(same, 1)
      assert await backend.update_weights_from_disk(same, 1) == 1  # the same weights, as version "1"
      again = await keyless.generate(PromptIds(ids), SamplingParams(max_new_tokens=6, temperature=1.0, seed=9))
      # Generation needs no key; the update forgot the cached prefix (SGLang's flush inside it).
      assert again == dataclasses.replace(gen, policy_version=1)
    finally:
      await backend.close()
      await keyless.close()

  asyncio.run(with_server(model, scenario))


@pytest.mark.slow
def test_command_line_server_serves_test_tiny(tmp_path):
  import os
  import subprocess
  import sys
  import time
  port = free_port()
  log = open(tmp_path / "server.log", "w")
  token_file = tmp_path / "admin_token"
  env = {k: v for k, v in os.environ.items() if k != "CLAWJAX_ADMIN_TOKEN"}
  proc = subprocess.Popen([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port),
                           "--max-slots", "2", "--max-seq-len", "128", "--prefill-chunk", "64",
                           "--admin-token-file", str(token_file)],
                          stdout=log, stderr=subprocess.STDOUT, env={**env, "JAX_PLATFORMS": "cpu"})
  url = f"http://127.0.0.1:{port}"
  try:
    deadline = time.time() + 300
    while True:
      assert proc.poll() is None, (tmp_path / "server.log").read_text()
      try:
        if http(url + "/health")[0] == 200:
          break
      except OSError:
        pass
      assert time.time() < deadline, "server did not come up"
      time.sleep(1)
    status, out = http(url + "/generate", {"input_ids": [1, 2, 3], "return_logprob": True,
                                           "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    assert status == 200 and len(out["output_ids"]) == 4 and out["meta_info"]["weight_version"] == "default"
    assert http(url + "/model_info")[1]["model_path"] == "test-tiny"
    # No $CLAWJAX_ADMIN_TOKEN: a generated token, readable by its owner only, opens the control routes.
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert http(url + "/flush_cache", {})[0] == 401
    assert http(url + "/flush_cache", {}, token_file.read_text().strip())[0] == 200
  finally:
    proc.terminate()
    proc.wait(timeout=60)
    log.close()
