"""The engine on the real SmolLM2-135M-Instruct: against transformers, the learner, and through the shim."""

import numpy as np
import pytest

from clawjax.engine.engine import Engine, EngineConfig
from clawjax.generation import SamplingParams
from clawjax.models.loading import load_model
from tests.engine.conftest import learner_logprobs

pytestmark = pytest.mark.slow

CHAT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
CONFIG = EngineConfig(max_slots=2, max_seq_len=192, prefill_chunk=64, min_bucket=64)


@pytest.fixture(scope="module")
def smollm2():
  return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def chat_ids(smollm2):
  from tokenizers import Tokenizer
  return Tokenizer.from_file(smollm2.path + "/tokenizer.json").encode(CHAT, add_special_tokens=False).ids


def test_greedy_equals_transformers_and_logprobs_equal_learner(smollm2, chat_ids):
  import torch
  import transformers
  new = 12
  hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2.path, dtype=torch.float32)
  with torch.no_grad():
    want = hf.generate(torch.tensor([chat_ids]), max_new_tokens=new, do_sample=False,
                       pad_token_id=smollm2.eos_token_id)[0, len(chat_ids):].tolist()
  engine = Engine(smollm2.model, CONFIG)
  try:
    greedy = engine.submit(chat_ids, SamplingParams(max_new_tokens=new, temperature=0.0,
                                              stop_token_ids=(smollm2.eos_token_id,))).result(timeout=600)
    sampled = engine.submit(chat_ids, SamplingParams(max_new_tokens=new, temperature=0.7, seed=0)).result(timeout=600)
  finally:
    engine.close()
  assert list(greedy.output_ids) == want  # "The answer is 4." and the end-of-turn token
  np.testing.assert_allclose(sampled.output_logprobs,
                             learner_logprobs(smollm2.model, chat_ids, sampled.output_ids, 0.7), atol=1e-4)


def test_openai_sdk_through_the_shim_gets_a_sensible_answer(tmp_path):
  import openai
  from clawjax.models.vocab import text_source
  from clawjax.serving.backends.base import create_backend
  from clawjax.serving.server import ShimConfig, ShimThread
  from clawjax.text.templates import load_template
  backend = create_backend("embedded", model="smollm2-135m", url=None, max_slots="2", max_seq_len="512",
                           prefill_chunk="64", min_bucket="64")
  config = ShimConfig(log_dir=str(tmp_path / "logs"), temperature=0.0, max_new_tokens=24, max_context=512,
                      incremental_stream=True)
  ask = dict(model="policy", messages=[{"role": "user", "content": "What is 2+2?"}])
  with ShimThread(config, backend, load_template(text_source("smollm2-135m"))) as shim:
    clients = []
    for _ in range(2):
      rollout = shim.create_rollout("arith", "openclaw")
      clients.append(openai.OpenAI(base_url=rollout["openai_base_url"], api_key=rollout["api_key"],
                                   max_retries=0))
    reply = clients[0].chat.completions.create(**ask)
    # The same greedy turn streamed as the engine samples it (--incremental-stream).
    pieces = [ch.choices[0].delta.content for ch in clients[1].chat.completions.create(**ask, stream=True)
              if ch.choices and ch.choices[0].delta.content]
  assert "4" in reply.choices[0].message.content
  assert len(pieces) > 2 and "".join(pieces) == reply.choices[0].message.content
