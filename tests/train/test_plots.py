"""experiments/plot.py's PNGs: reward.png draws one line per harness of a mixed-harness run (beside the mean
over all rollouts and the held-out evaluation), and no panel title of learner.png runs off the image."""
from __future__ import annotations

import json
import math

import matplotlib.image as mpimg
import numpy as np
import pytest

from clawjax.report.charts import read_metrics
from clawjax.train.plots import plot_run, reward_lines

LEARNER_METRICS = ("entropy", "approx_kl", "clip_fraction", "clip_fraction_last", "tis_truncated_fraction",
                   "grad_norm", "mean_abs_logp_old_minus_rollout")


def _write_metrics(workdir, harnesses, steps=6):
  rows = []
  for step in range(1, steps + 1):
    per = {h: (step * (i + 1) % 5) / 5 for i, h in enumerate(harnesses)}
    row = {"phase": "rl", "step": step, "reward/mean": float(np.mean(list(per.values()))), "reward/std": 0.2}
    row.update({f"reward_harness/{h}/mean": r for h, r in per.items()})
    row.update({k: 0.01 * step for k in LEARNER_METRICS})
    rows.append(row)
  rows += [{"phase": "sft", "step": s, "nll": math.exp(-s)} for s in (1, 2, 3)]
  rows.append({"phase": "eval", "step": steps, "reward/mean": 0.5, "ok_fraction": 1.0})
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return rows


def test_reward_png_draws_one_line_per_harness(tmp_path):
  rows = _write_metrics(tmp_path, ["mini", "openclaw"])
  lines = reward_lines(read_metrics(tmp_path))
  assert list(lines) == ["all rollouts", "mini", "openclaw", "held-out eval"]
  rl = [r for r in rows if r["phase"] == "rl"]
  for harness in ("mini", "openclaw"):
    assert lines[harness] == ([r["step"] for r in rl], [r[f"reward_harness/{harness}/mean"] for r in rl])
  assert lines["all rollouts"][1] == [r["reward/mean"] for r in rl]
  one = tmp_path / "one"
  one.mkdir()
  _write_metrics(one, ["mini"])
  assert list(reward_lines(read_metrics(one))) == ["train reward", "held-out eval"]  # its mean is the mean


@pytest.mark.parametrize("name", ["learner.png", "reward.png"])
def test_no_title_or_label_runs_off_the_png(tmp_path, name):
  _write_metrics(tmp_path, ["mini", "openclaw"])
  paths = {p.name: p for p in plot_run(tmp_path)}
  ink = mpimg.imread(paths[name])[..., :3].min(axis=2) < 0.9
  assert ink.any()
  # A title cut off at the image's edge leaves ink in its outermost pixels.
  assert not (ink[0].any() or ink[-1].any() or ink[:, 0].any() or ink[:, -1].any())
