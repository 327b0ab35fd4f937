"""A whole SFT run (`run_stage`): a crash and rerun ends exactly where an uninterrupted run does (weights
bit for bit, the same metrics, one line per update); the learning rate follows transformers'
`cosine_with_min_lr` with warm-up (written out independently below); sharded over a mesh it computes the
same losses; a resume on another config or other data is refused; data holding ids past the model's
vocabulary is refused naming its record; the export loads with clawjax's loader and with `transformers` (logits and
tokenizer ids agree), and renders with the same chat template."""
from __future__ import annotations

import json
import math
import pathlib
import re

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from clawjax.config import ConfigError
from clawjax.models.config import preset
from clawjax.models.loading import load_model
from clawjax.models.model import Decoder, causal_inputs
from clawjax.sft.config import sft_config
from clawjax.sft.export import export_model
from clawjax.sft.stage import run_stage
from clawjax.text.messages import Message
from clawjax.text.templates import load_template
from clawjax.train.metrics import MetricsWriter, read_metrics
from clawjax.tree.vocab import VocabularyError

DATA = pathlib.Path(__file__).resolve().parents[2] / "clawjax" / "data" / "sft"
TOY = {"init": "smollm2-135m", "random_init": True, "template": "smollm2",
       "overrides": {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16, "mlp_dim": 64,
                     "attention_impl": "blocked", "attention_block": 256}}


def _config(tmp_path, **fields):
  train = tmp_path / "train.jsonl"
  if not train.exists():
    train.write_text("".join((DATA / "train.jsonl").read_text().splitlines(keepends=True)[:8]))
  return sft_config({"data": {"openai": [str(train)]}, "heldout": {"openai": [str(DATA / "heldout.jsonl")]},
                     "max_len": 1024, "rows": 2, "epochs": 3, "warmup_ratio": 0.2, "checkpoint_every": 1,
                     "keep_checkpoints": 10, "model": TOY, "progress": False, "tensorboard": False,
                     "learner": {"lr": 3e-3, "logits_chunk": 32}, **fields})


class _CrashAt(MetricsWriter):
  """Metrics that fail when the run writes update `step`: a crash after that update, before its
  checkpoint."""

  def __init__(self, workdir, step):
    super().__init__(workdir, tensorboard=False)
    self.step = step

  def write(self, phase, step, metrics):
    if step == self.step:
      raise KeyboardInterrupt("crash")
    super().write(phase, step, metrics)


def _run(cfg, workdir, metrics=None):
  metrics = metrics or MetricsWriter(workdir, tensorboard=False)
  try:
    return run_stage(cfg, workdir, metrics)
  finally:
    metrics.close()


def _weights(workdir):
  return safetensors.numpy.load_file(str(pathlib.Path(workdir) / "hf" / "model.safetensors"))


def _cosine_with_min_lr(step, lr, warmup, total, min_ratio):
  """transformers' get_cosine_with_min_lr_schedule_with_warmup at optimizer step `step`."""
  if step < warmup:
    return lr * step / max(1, warmup)
  progress = (step - warmup) / max(1, total - warmup)
  return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.slow
def test_a_crashed_run_resumes_to_the_same_weights_and_metrics(tmp_path):
  cfg = _config(tmp_path)
  straight = _run(cfg, tmp_path / "straight")
  assert straight["updates"] == 6 and straight["epochs"] == 3  # 8 conversations, 2 a row, 2 rows an update
  with pytest.raises(KeyboardInterrupt):
    _run(cfg, tmp_path / "crashed", _CrashAt(tmp_path / "crashed", 4))
  assert not (tmp_path / "crashed" / "hf").exists()
  resumed = _run(cfg, tmp_path / "crashed")
  assert resumed["last_nll"] == straight["last_nll"] and resumed["heldout_nll"] == straight["heldout_nll"]
  a, b = _weights(tmp_path / "straight"), _weights(tmp_path / "crashed")
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  rows = {d: read_metrics(tmp_path / d, "sft") for d in ("straight", "crashed")}
  assert [r["step"] for r in rows["crashed"]] == list(range(7))  # one line per update, step 0: held-out
  strip = lambda r: {k: v for k, v in r.items() if k not in ("time", "tokens_per_s", "step_seconds")}
  assert [strip(r) for r in rows["crashed"]] == [strip(r) for r in rows["straight"]]

  # The schedule: warm-up over ceil(0.2 x 6) = 2 updates, cosine to 0.1 x lr.
  lrs = [r["lr"] for r in rows["straight"][1:]]
  np.testing.assert_allclose(lrs, [_cosine_with_min_lr(s, 3e-3, 2, 6, 0.1) for s in range(6)], rtol=1e-6, atol=1e-12)
  first, last = rows["straight"][0]["heldout_nll"], rows["straight"][-1]["heldout_nll"]
  assert last < first
  data = json.loads((tmp_path / "straight" / "data.json").read_text())
  assert data["counts"] == {"conversations": 8, "whole": 8} and data["heldout_trees"] == 6
  assert json.loads((tmp_path / "straight" / "environment.json").read_text())["schema"] == "clawjax.environment/1"
  assert all(0 <= r["padding_fraction"] < 0.1 for r in rows["straight"][1:])

  # Sharded over a 2 x 2 (data x fsdp) mesh, the same batches give the same losses.
  _run(_config(tmp_path, mesh={"data": 2, "fsdp": 2}, steps=2), tmp_path / "sharded")
  sharded = read_metrics(tmp_path / "sharded", "sft")
  np.testing.assert_allclose([sharded[0]["heldout_nll"], sharded[1]["nll"]],
                             [rows["straight"][0]["heldout_nll"], rows["straight"][1]["nll"]], rtol=1e-5)

  # A resume must train what the run started with.
  with pytest.raises(ConfigError, match="learner.lr"):
    _run(_config(tmp_path, learner={"lr": 1e-3, "logits_chunk": 32}), tmp_path / "crashed")
  (tmp_path / "train.jsonl").write_text((DATA / "train.jsonl").read_text().splitlines(keepends=True)[9])
  with pytest.raises(ConfigError, match="training data differs"):
    _run(cfg, tmp_path / "crashed")

  # The export is a model directory train.py, the engine and transformers take.
  export = tmp_path / "straight" / "hf"
  _check_loads_like_transformers(export, load_model(str(export)).model)
  messages = [Message("system", "sys"), Message("user", "Write the word apple into a.txt.")]
  assert load_template(str(export)).render(messages) == load_template("smollm2").render(messages)


def _check_loads_like_transformers(export: pathlib.Path, ours: Decoder) -> None:
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
  tok = transformers.AutoTokenizer.from_pretrained(str(export))
  text = "<|im_start|>user\nWrite the word apple into a.txt.<|im_end|>\n"
  ids = tok(text, add_special_tokens=False)["input_ids"]
  assert ids == load_template(str(export)).tokenizer.encode(text)
  with torch.no_grad():
    want = hf(torch.tensor([ids])).logits.numpy()[0]
  got = np.asarray(ours(*causal_inputs(jnp.asarray([ids]))))[0]
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_data_tokenized_for_another_model_is_refused_naming_its_record(tmp_path):
  """The toy model's vocabulary cut to 256 ids, below its tokenizer's: the stage stops before any update
  with one line naming the first conversation (file:line), the id and the vocabulary size."""
  cfg = _config(tmp_path, model={**TOY, "overrides": {**TOY["overrides"], "vocab_size": 256}})
  where = re.escape(f"{tmp_path / 'train.jsonl'}:1")
  with pytest.raises(VocabularyError, match=rf"^{where}: token id \d+ is outside the model's vocabulary \[0, 256\): "
                                            "the data was tokenized for another model"):
    _run(cfg, tmp_path / "run")
  assert not (tmp_path / "run" / "checkpoints" / "1").exists()


def test_a_qwen3_export_loads_with_transformers(tmp_path):
  model = Decoder(preset("test-tiny"), rngs=__import__("flax").nnx.Rngs(1))
  out = export_model(model, tmp_path / "hf", init="test-tiny", template=load_template("qwen3"))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {p.name for p in out.iterdir()}
  loaded = load_model(str(out)).model
  _check_loads_like_transformers(out, loaded)
  export_model(model, out, init="test-tiny", template=load_template("qwen3"))  # over an older export
  assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
