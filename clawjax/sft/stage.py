"""One SFT run in a workdir: data -> packed updates on the learner -> a Hugging Face directory.

  summary = run_stage(config, workdir, metrics)   # metrics: clawjax.train.metrics.MetricsWriter(workdir)

WORKDIR layout: config.json (resumes must match it, config.py), environment.json
(clawjax/environment.py), data.json (what each source gave and left out, and a fingerprint of the
trees: a resume on other data is refused, since the update plan follows from it), checkpoints/ (Orbax:
params, optimizer state, RNG; the cursor holds the update), metrics.jsonl + tb/ (loop.py), hf/ (the
export; `export_dir` elsewhere) and summary.json. Rerunning the same command resumes after the last
checkpoint and replays the same batches: the result equals an uninterrupted run's. Data holding a token
id outside the model's vocabulary is refused before any update, naming its record (clawjax.tree.vocab).

Several processes (cfg.distributed: one per host, the same command on each, after
`clawjax.distributed.initialize`) run one stage together: each reads the data and makes the same plan,
feeds its share of every update's rows (clawjax/sft/loop.py), and writes and restores its shards of the
checkpoints; process 0 writes config.json, environment.json, data.json, summary.json and the metrics
(the caller's `metrics` is enabled there only); the export is written by all (clawjax/sft/export.py).
WORKDIR must be on a filesystem every process sees.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import pathlib
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import numpy as np

from clawjax import config as config_lib
from clawjax import distributed, environment, sharding
from clawjax.models.loading import load_model
from clawjax.rl.checkpoint import Checkpointer
from clawjax.rl.learner import Learner
from clawjax.run.session import chat_template
from clawjax.sft.config import SFTRunConfig, check_resume
from clawjax.sft.data import Counts
from clawjax.sft.dataset import load_trees, split_heldout
from clawjax.sft.export import export_model
from clawjax.sft.loop import PHASE, Metrics, fit, heldout_batches, heldout_nll, lr_schedule, make_plan
from clawjax.tree.build import CallTree
from clawjax.tree.vocab import refuse_trees

log = logging.getLogger(__name__)

CONFIG_FILE, DATA_FILE, SUMMARY_FILE = "config.json", "data.json", "summary.json"


class RunMetrics(Metrics, Protocol):
  """clawjax.train.metrics.MetricsWriter: the loop's `write`, and `truncate` for a resume."""

  def truncate(self, phase: str, from_step: int) -> None:
    ...


def fingerprint(trees: Sequence[CallTree]) -> str:
  """A hash of the trees' ids, tokens and trained tokens: equal data gives equal update plans."""
  h = hashlib.sha256()
  for t in trees:
    h.update(t.rollout_id.encode() + b"\0")
    h.update(np.ascontiguousarray(t.tokens_T).tobytes())
    h.update(np.packbits(t.owner_T >= 0).tobytes())
  return h.hexdigest()


def _pin_config(workdir: pathlib.Path, cfg: SFTRunConfig, resuming: bool) -> None:
  """Writes config.json; a resume must find the same config (RESUMABLE_CHANGES aside)."""
  path = workdir / CONFIG_FILE
  if resuming and path.exists():
    check_resume(json.loads(path.read_text()), cfg)
  _write_once(path, config_lib.to_json(cfg))


def _pin_data(workdir: pathlib.Path, data: dict[str, Any], resuming: bool) -> None:
  """Writes data.json; a resume must find the same trees (the update plan follows from them)."""
  path = workdir / DATA_FILE
  if resuming and path.exists():
    saved = json.loads(path.read_text())
    if saved["fingerprint"] != data["fingerprint"]:
      raise config_lib.ConfigError(
          f"the training data differs from what this run started on ({path}: {saved['train_trees']} "
          f"trees, now {data['train_trees']}); resume on the same data or use another --workdir")
  _write_once(path, data)


def _write_once(path: pathlib.Path, obj: Any) -> None:
  """Process 0 writes `obj` as JSON to `path`, once every process has read what was there."""
  distributed.sync(f"sft: {path.name} read")
  if distributed.is_primary():
    path.write_text(json.dumps(obj, indent=2) + "\n")


def run_stage(cfg: SFTRunConfig, workdir: str | pathlib.Path, metrics: RunMetrics) -> dict[str, Any]:
  """Trains (or resumes) in `workdir`; returns the summary (also in summary.json). With several
  processes, every process calls it (module docstring)."""
  t0 = time.time()
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  ckpt = Checkpointer(workdir / "checkpoints", cfg.keep_checkpoints)
  resuming = ckpt.latest_step() is not None
  _pin_config(workdir, cfg, resuming)
  if distributed.is_primary():
    environment.write_environment(workdir)
  template = chat_template(cfg.model)
  counts, heldout_counts = Counts(), Counts()
  trees = load_trees(cfg.data, template, cfg, counts)
  if cfg.heldout.paths():
    held = load_trees(cfg.heldout, template, cfg, heldout_counts)
  else:
    trees, held = split_heldout(trees, cfg.heldout_fraction, cfg.seed)
  data = {"train_trees": len(trees), "heldout_trees": len(held), "train_tokens": int(sum(t.size for t in trees)),
          "train_loss_tokens": sum(t.loss_tokens for t in trees),
          "counts": dict(sorted(counts.items())), "heldout_counts": dict(sorted(heldout_counts.items())),
          "fingerprint": fingerprint(trees + held)}
  _pin_data(workdir, data, resuming)
  log.info("SFT data: %d trees (%d tokens) to train, %d held out; %s", len(trees), data["train_tokens"],
           len(held), data["counts"])

  row_len = cfg.max_len
  plan = make_plan([t.size for t in trees], row_len=row_len, rows=cfg.rows, pool_batches=cfg.pool_batches,
                   seed=cfg.seed, epochs=cfg.epochs, steps=cfg.steps)
  sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, cfg.mesh.expert]
  mesh = sharding.make_mesh(cfg.mesh, jax.devices() if -1 in sizes else jax.devices()[:math.prod(sizes)])
  model = cfg.model
  policy = load_model(model.init, seed=cfg.seed, mesh=mesh, random_init=model.random_init, **model.overrides).model
  refuse_trees(trees + held, policy.cfg.vocab_size)
  schedule = lr_schedule(cfg.learner.lr, len(plan), cfg.warmup_ratio, cfg.min_lr_ratio)
  learner = Learner(cfg.learner, policy, mesh=mesh, policy_schedule=schedule)
  start = 0
  if resuming:
    learner.state, cursor = ckpt.restore(learner.state)
    start = int(cursor["step"])
    log.info("resuming after SFT update %d of %d", start, len(plan))
  metrics.truncate(PHASE, start + 1 if start else 0)  # (step 0: the held-out loss before training)
  held_batches = heldout_batches(learner, held, row_len=row_len, rows=cfg.rows)

  def checkpoint(step: int) -> None:
    if step % cfg.checkpoint_every == 0 or step == len(plan):
      ckpt.save(learner.state, cursor={"step": step})

  last = fit(learner, trees, plan, row_len=row_len, rows=cfg.rows, metrics=metrics, start=start,
             heldout=held_batches, eval_every=cfg.eval_every, schedule=schedule, on_step=checkpoint,
             progress=cfg.progress and distributed.is_primary())
  out = export_model(learner.policy_model(), cfg.export_dir or workdir / "hf", init=model.init, template=template)
  summary = {"updates": len(plan), "epochs": plan[-1].epoch + 1, "train_trees": len(trees),
             "heldout_trees": len(held), "last_nll": last.get("nll"),
             "heldout_nll": last["heldout_nll"] if "heldout_nll" in last else (
                 heldout_nll(learner, held_batches) if held_batches else None),
             "export_dir": str(out), "wall_s": round(time.time() - t0, 1), "counts": data["counts"]}
  if distributed.is_primary():
    (workdir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
  ckpt.close()
  return summary
