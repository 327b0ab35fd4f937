"""`python -m clawjax.models export`: a training run's checkpoint (the learner's train state, saved by the
trainer's Checkpointer, the run's config.json) as an HF directory that transformers loads with the same
logits as the policy, with a tokenizer that encodes as clawjax's, and that the engine's loader reads back."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors import safe_open

from clawjax import config as config_lib
from clawjax.models import hf_io
from clawjax.models.__main__ import main
from clawjax.models.export import export
from clawjax.models.loading import load_model
from clawjax.models.model import causal_inputs
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.text.tokenizer import load_tokenizer
from clawjax.train.config import train_config

from tests.models.helpers import forward, rel_err

OVERRIDES = dict(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)


def _run(tmp_path):
  """A run directory with config.json and a checkpoint whose policy differs from the initial weights."""
  cfg = train_config({"tasks": str(tmp_path), "harnesses": ["mini"], "model": {"init": "test-tiny", "overrides": OVERRIDES}, "seed": 3})
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(config_lib.to_json(cfg), indent=2))
  learner = Learner(cfg.learner, load_model("test-tiny", seed=3, **OVERRIDES).model)
  keys = iter(jax.random.split(jax.random.key(0), 1000))
  moved = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), learner.state.params)
  learner.state = dataclasses.replace(learner.state, params=moved)
  step = Checkpointer(run / "checkpoints").save(learner.state, cursor={"step": 1})
  return run, run / "checkpoints" / str(step), learner.policy_model()


def test_export_matches_the_policy_in_transformers(tmp_path):
  run, step_dir, policy = _run(tmp_path)
  out = tmp_path / "hf"
  assert main(["export", "--checkpoint", str(step_dir), "--out", str(out)]) == 0
  files = {p.name for p in out.iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
  tokens = np.random.default_rng(0).integers(0, 151_000, size=(2, 20), dtype=np.int32)
  ours = np.asarray(forward(policy, *causal_inputs(jnp.asarray(tokens))))
  hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
  with torch.no_grad():
    theirs = hf(torch.from_numpy(tokens).long()).logits.numpy()
  assert rel_err(ours, theirs) < 1e-4
  # The checkpoint's weights, not the initial ones the config would rebuild.
  initial = load_model("test-tiny", seed=3, **OVERRIDES).model
  assert rel_err(np.asarray(forward(initial, *causal_inputs(jnp.asarray(tokens)))), theirs) > 1e-2
  # The embedded engine's loader reads it back bit for bit; the tokenizer encodes as clawjax's.
  np.testing.assert_array_equal(np.asarray(forward(hf_io.load(out), *causal_inputs(jnp.asarray(tokens)))), ours)
  text = "def f(x):\n    return x  # héllo <tool_call>"
  hf_tok = transformers.AutoTokenizer.from_pretrained(out)
  assert hf_tok.encode(text, add_special_tokens=False) == load_tokenizer("qwen3").encode(text)


def test_a_checkpoint_of_another_architecture_is_named(tmp_path, capsys):
  run, step_dir, _ = _run(tmp_path)
  cfg = json.loads((run / "config.json").read_text())
  cfg["model"]["overrides"]["n_layers"] = 3
  other = tmp_path / "other.json"
  other.write_text(json.dumps(cfg))
  assert main(["export", "--checkpoint", str(step_dir), "--out", str(tmp_path / "x"), "--config", str(other)]) == 1
  assert "state: the checkpoint lacks ['params.policy.layers.2." in capsys.readouterr().err
  with pytest.raises(ValueError, match="not a checkpoint step directory"):
    export(run / "checkpoints", tmp_path / "y", run / "config.json")


@pytest.mark.parametrize("name", ["test-tiny", "test-tiny-moe"])
def test_a_push_export_in_the_compute_dtype_serves_the_same_forward(name, tmp_path):
  """bf16 compute over f32 master weights: the push writes bf16 (half the bytes), and a model loaded from
  it computes exactly the learner's logits, as every param is cast to bf16 before use anyway."""
  model = load_model(name, seed=1, dtype="bfloat16", param_dtype="float32").model
  assert hf_io.push_dtype(model.cfg) == "bfloat16"
  assert hf_io.push_dtype(load_model(name, seed=1).model.cfg) == "float32"  # f32 compute: all bits kept
  wide, narrow = hf_io.save(model, tmp_path / "f32"), hf_io.save(model, tmp_path / "bf16", dtype="bfloat16")
  size = lambda d: (d / "model.safetensors").stat().st_size  # noqa: E731
  assert 0.49 < size(narrow) / size(wide) < 0.51
  assert json.loads((narrow / "config.json").read_text())["torch_dtype"] == "bfloat16"
  with safe_open(narrow / "model.safetensors", "np") as f:
    assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
  # Each tensor is the f32 one rounded to nearest bf16.
  with safe_open(wide / "model.safetensors", "np") as f32, safe_open(narrow / "model.safetensors", "np") as bf16:
    for key in f32.keys():
      np.testing.assert_array_equal(bf16.get_tensor(key), f32.get_tensor(key).astype(jnp.bfloat16), err_msg=key)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 500, size=(2, 16), dtype=np.int32))
  served = hf_io.load(narrow, dtype="bfloat16", param_dtype="float32")
  np.testing.assert_array_equal(np.asarray(forward(served, *causal_inputs(tokens))),
                                np.asarray(forward(model, *causal_inputs(tokens))))
