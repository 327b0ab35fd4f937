"""Cold-start SFT before RL (the paper's OpenClaw runs start from a light SFT, "ClawII-Cold").

Demonstrations go through the same path as RL rollouts: the real harness talks to the shim, whose
backend is a scripted demonstrator instead of the model, so the recorded token ids are exactly what
the harness and template produce. The trees of those calls are trained with token-level cross-entropy
(the "sft" loss). The built-in demonstrator (`ChoiceDemonstrator`) teaches the tool-call format of a
task family that asks to write one of a few listed words into a named file: it writes a *balanced*
choice (each task gets every listed word equally often), so SFT teaches the format, and that each task
has its own words, but leaves the choice among them to RL.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import pathlib
import re
import threading

import jax.numpy as jnp
import numpy as np

from clawjax.calllog import CallLogWriter, load
from clawjax.harness.rollout import RolloutConfig, run_rollouts
from clawjax.rl.advantages import RolloutScores, grpo_advantages
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.rl.loop_metrics import MetricsWriter
from clawjax.rl.losses import LossTerms, TokenInputs, register_loss
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.serving.server import ShimConfig, ShimThread
from clawjax.tasks import Task
from clawjax.text.templates import RESPONSE_OPEN, ChatTemplate
from clawjax.tree.build import CallTree
from clawjax.tree.filters import FilterConfig, filter_rollout
from clawjax.tree.pack import pack_trees

log = logging.getLogger(__name__)


@register_loss("sft")
def sft_loss(x: TokenInputs, cfg: LearnerConfig) -> LossTerms:
  """Cross-entropy on the demonstrated tokens. It goes in `extra`, which the TIS weight does not
  scale: a demonstration has no sampling distribution to correct for."""
  del cfg
  return LossTerms(policy=jnp.zeros_like(x.logp), extra=-x.logp, metrics={"nll": -x.logp})


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  steps: int = 0                   # SFT updates; 0 = no SFT stage
  lr: float = 3e-3                 # a small model from scratch needs a large step (quickstart value)
  demos_per_task: int = 8          # demonstrations recorded per task (a multiple of len(choices))
  rows: int = 8                    # trees per SFT update (one tree per row)
  row_len: int = 1024              # longest demonstration tree
  # A regex on the task prompt with groups "path" (the file to write) and "choices" (the words, split
  # at commas and "or"); the demonstrator writes each listed word in turn.
  prompt_pattern: str = r"\((?P<choices>[^()]*)\) into (?P<path>\S+\.txt)"
  final_text: str = "Done."        # the demonstrator's answer once the tool result is back
  concurrency: int = 8             # demonstration rollouts in flight

  def __post_init__(self):
    groups = re.compile(self.prompt_pattern).groupindex
    if not {"path", "choices"} <= set(groups):
      raise ValueError(f"SFTConfig.prompt_pattern {self.prompt_pattern!r}: needs groups 'path' and 'choices'")


class ChoiceDemonstrator:
  """A scripted policy (it stands for the model, never for a component): first call -> a `write`
  tool call of the task's next listed word; after a tool result -> `final_text`."""

  def __init__(self, template: ChatTemplate, config: SFTConfig):
    self.template, self.config = template, config
    self.pattern = re.compile(config.prompt_pattern)
    self._next: collections.Counter[str] = collections.Counter()
    self._lock = threading.Lock()

  def __call__(self, input_ids: list[int]) -> ScriptTurn:
    text = self.template.tokenizer.decode(input_ids)
    if RESPONSE_OPEN in text:
      return ScriptTurn(self.config.final_text)
    found = list(self.pattern.finditer(text))
    if not found:
      raise ValueError(f"SFTConfig.prompt_pattern {self.config.prompt_pattern!r} matches nothing in the prompt")
    path = found[-1]["path"]
    choices = [w for w in re.split(r",\s*|\s+or\s+", found[-1]["choices"]) if w]
    with self._lock:
      k = self._next[path]
      self._next[path] += 1
    word = choices[k % len(choices)]
    return ScriptTurn("", None, (("write", {"path": path, "content": word}),))


def record_demos(tasks: list[Task], harness: str, template: ChatTemplate, config: SFTConfig,
                 shim: ShimConfig, rollout: RolloutConfig, out_dir: pathlib.Path
                 ) -> tuple[list[CallTree], RolloutScores]:
  """Runs the demonstrations; returns their trees (sorted by content, so the order is reproducible)."""
  calls_dir = out_dir / "calls"
  backend = ScriptedBackend(template, ChoiceDemonstrator(template, config))
  with ShimThread(dataclasses.replace(shim, log_dir=str(calls_dir)), backend, template) as server, \
       CallLogWriter(out_dir / "rollouts.jsonl") as writer:
    jobs = [(t, harness) for t in tasks for _ in range(config.demos_per_task)]
    run_rollouts(server.url, jobs, rollout, writer, concurrency=config.concurrency)
  loaded = load([calls_dir, out_dir / "rollouts.jsonl"], errors="collect")
  ok = [r for r in loaded.rollouts.values() if r.status == "ok"]
  trees = [filter_rollout(r.rollout_id, loaded.calls.get(r.rollout_id, []), FilterConfig()).tree for r in ok]
  trees = [t for t in trees if t.size]
  if not trees:
    raise RuntimeError(f"SFT: no usable demonstration among {len(jobs)} (see {out_dir})")
  log.info("SFT: %d demonstrations of %d usable", len(trees), len(jobs))
  return sorted(trees, key=lambda t: t.tokens_T.tobytes()), grpo_advantages(ok)


def run_sft(policy, trees: list[CallTree], scores: RolloutScores, config: SFTConfig, learner_config: LearnerConfig,
            metrics: MetricsWriter, seed: int):
  """`config.steps` cross-entropy updates on random draws of `rows` demonstration trees; returns the
  trained policy module."""
  sft_cfg = dataclasses.replace(learner_config, loss="sft", lr=config.lr, kl_coef=0.0, warmup_steps=0,
                                micro_batches=1, epochs=1, minibatches=1, shuffle=False,
                                value=dataclasses.replace(learner_config.value, kind="none"))
  learner = Learner(sft_cfg, policy)
  rng = np.random.default_rng(seed)
  chunk = sft_cfg.logits_chunk
  per_row = max(int((t.owner_T >= 0).sum()) for t in trees) * 2  # first-fit may put two trees in a row
  loss_slots = -(-per_row // chunk) * chunk
  for step in range(1, config.steps + 1):
    pick = rng.choice(len(trees), size=config.rows, replace=len(trees) < config.rows)
    batch = pack_trees([trees[i] for i in pick], scores, row_len=config.row_len, rows=config.rows)
    m = learner.step(learner.prepare(batch, loss_slots=loss_slots))
    metrics.write("sft", step, {"nll": m["nll"], "grad_norm": m["grad_norm"], "step_seconds": m["step_seconds"]})
    if step % 10 == 0 or step == config.steps:
      log.info("SFT step %d/%d: nll %.4f", step, config.steps, m["nll"])
  return learner.policy_model()
