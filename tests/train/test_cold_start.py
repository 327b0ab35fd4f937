"""Cold-start SFT: the "sft" loss is the mean token NLL of the demonstrated tokens (checked against
float64 numpy on the model's full-vocabulary logits), untouched by the TIS weight; the demonstrator
writes each listed word equally often per task; demonstrations recorded through the harness are read and
trained by the SFT stage's code."""
from __future__ import annotations

import collections
import pathlib

import jax.numpy as jnp
import numpy as np
from flax import nnx

from clawjax import config as config_lib
from clawjax.calllog import load
from clawjax.models.loading import load_model
from clawjax.tasks import select_tasks
from clawjax.train.cold_start import SFTConfig, record_demos, run_sft
from clawjax.train.config import train_config
from clawjax.train.metrics import MetricsWriter, read_metrics

from clawjax.data.quickstart.demonstrator import ChoiceDemonstrator
from clawjax.models.config import PRESETS
from clawjax.models.model import Decoder, causal_inputs
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.text.templates import RESPONSE_OPEN, load_template
from clawjax.tree.batch import PackedBatch

TINY = PRESETS["test-tiny-vocab"].replace(n_layers=1, vocab_size=128)
ROOT = pathlib.Path(__file__).resolve().parents[2]
quickstart = config_lib.config_module(str(ROOT / "configs" / "quickstart.py"), "quickstart.py")


def _causal_batch(tokens: np.ndarray, trained: np.ndarray, logp_rollout: np.ndarray) -> PackedBatch:
  rows, t = tokens.shape
  w = trained.astype(np.float32)
  return PackedBatch(
      tokens_RT=tokens, positions_RT=np.tile(np.arange(t, dtype=np.int32), (rows, 1)),
      parent_index_RT=np.tile(np.arange(-1, t - 1, dtype=np.int32), (rows, 1)),
      subtree_end_RT=np.full((rows, t), t, np.int32), segment_ids_RT=np.ones((rows, t), np.int32),
      unique_weight_RT=w, path_weight_RT=w, rollout_logprobs_RT=logp_rollout.astype(np.float32),
      advantages_RT=np.zeros((rows, t), np.float32), returns_RT=np.zeros((rows, t), np.float32),
      baselines_RT=np.zeros((rows, t), np.float32),
      rollout_index_RT=np.zeros((rows, t), np.int32), rollout_ids_N=["d"],
      group_ids_N=np.zeros(1, np.int32), rewards_N=np.zeros(1, np.float32))


def test_sft_loss_is_token_nll_without_tis():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, TINY.vocab_size, (2, 24)).astype(np.int32)
  trained = rng.random((2, 24)) < 0.5
  trained[:, 0] = False
  model = Decoder(TINY, rngs=nnx.Rngs(0))
  logits = np.asarray(model(*causal_inputs(jnp.asarray(tokens))), np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
  logp = np.take_along_axis(logits[:, :-1], tokens[:, 1:, None], -1)[..., 0] - logz[:, :-1]
  want = -logp[trained[:, 1:]].mean()
  # Rollout log-probs far from the model's would give TIS weights of c_bar; SFT must ignore them.
  batch = _causal_batch(tokens, trained, np.where(trained, -30.0, 0.0))
  learner = Learner(LearnerConfig(loss="sft", logits_chunk=16), model)
  loss, _, metrics = learner.loss_and_grads(batch)
  np.testing.assert_allclose(loss, want, rtol=1e-4)
  np.testing.assert_allclose(metrics["nll"], want, rtol=1e-4)


def test_demonstrator_is_balanced_per_task():
  template = load_template("smollm2")
  demo = ChoiceDemonstrator(template)
  prompts = {f: template.tokenizer.encode(f"Write one word (a, b, c or d) into {f}.txt.") for f in ("x", "y")}
  counts = collections.Counter()
  for _ in range(8):
    for f, ids in prompts.items():
      (name, args), = demo(ids).tool_calls
      assert name == "write" and args["path"] == f"{f}.txt"
      counts[f, args["content"]] += 1
  assert counts == {(f, w): 2 for f in ("x", "y") for w in "abcd"}
  after_tool = template.tokenizer.encode(f"{RESPONSE_OPEN}\nwrote 1 chars")
  assert demo(after_tool).text == "Done." and not demo(after_tool).tool_calls


def test_demonstrations_are_recorded_through_the_harness_and_trained_by_the_sft_loop(tmp_path):
  """The quickstart's cold start: demonstrations through the real `mini` and shim, read back by the SFT
  stage's call-log source (each tree exactly the demonstrator's logged calls), then trained by its loop."""
  c = quickstart.get_config().to_dict()
  c.update(progress=False, tensorboard=False)
  c["rollout"]["work_root"] = str(tmp_path / "work")
  c["sft"].update(demos_per_task=2, steps=3, concurrency=4)
  cfg = train_config(c)
  tasks = select_tasks(cfg.tasks)
  trees = record_demos(cfg, tasks, tmp_path / "sft")
  assert len(trees) == 2 * len(tasks)
  calls = load(tmp_path / "sft" / "calls").calls
  for t in trees:
    logged = calls[t.rollout_id.rsplit(":", 1)[1]]
    assert t.tokens_T.tolist() == list(logged[-1].input_ids + logged[-1].output_ids)
    assert (t.owner_T >= 0).sum() == sum(len(c.output_ids) for c in logged)
  metrics = MetricsWriter(tmp_path, tensorboard=False)
  policy = load_model(cfg.model.init, random_init=True, **cfg.model.overrides).model
  run_sft(policy, trees, cfg.sft, cfg.learner, metrics, cfg.seed)
  metrics.close()
  rows = read_metrics(tmp_path, "sft")
  assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["nll"] < rows[0]["nll"]


def test_the_sft_stage_takes_an_rl_config_with_loss_options_and_a_rollout_aggregation():
  """The cold start trains cross-entropy as a token mean, whatever the RL loss's options and aggregation
  (they are the RL loss's, and "sft" declares no options)."""
  from clawjax.rl.loss_check import example_trees, tiny_policy
  trees, _ = example_trees(0)
  written = []

  class Metrics:
    def write(self, phase, step, metrics):
      written.append((phase, step, metrics))

  rl = LearnerConfig(loss="grpo", loss_kwargs={"advantage_std": False}, aggregation="constant",
                     aggregation_tokens=64, logits_chunk=64)
  run_sft(tiny_policy(), trees, SFTConfig(steps=1, rows=4, row_len=256), rl, Metrics(), seed=0)
  assert [(phase, step) for phase, step, _ in written] == [("sft", 1)] and np.isfinite(written[0][2]["nll"])
