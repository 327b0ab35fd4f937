"""A run's metrics.jsonl -> PNG curves: reward.png (RL reward per step, held-out eval if any, SFT loss)
and learner.png (entropy, KL, clip and TIS-truncation fractions, grad norm)."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from clawjax.train.metrics import read_metrics  # pylint: disable=wrong-import-position

LEARNER_KEYS = ("entropy", "approx_kl", "clip_fraction", "clip_fraction_last", "tis_truncated_fraction",
                "grad_norm", "mean_abs_logp_old_minus_rollout")


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
  pts = sorted((r["step"], r[key]) for r in rows if key in r)
  return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(workdir: str | pathlib.Path, out_dir: str | pathlib.Path | None = None) -> list[pathlib.Path]:
  """Writes the PNGs (into `out_dir`, default the run dir); returns their paths."""
  workdir = pathlib.Path(workdir)
  out_dir = pathlib.Path(out_dir or workdir)
  out_dir.mkdir(parents=True, exist_ok=True)
  rl, sft, ev = (read_metrics(workdir, p) for p in ("rl", "sft", "eval"))
  if not (rl or sft):
    raise ValueError(f"{workdir}: no metrics to plot")
  written = []
  fig, axes = plt.subplots(1, 2 if sft else 1, figsize=(11 if sft else 6, 4), squeeze=False)
  ax = axes[0][0]
  x, y = _series(rl, "reward/mean")
  _, sd = _series(rl, "reward/std")
  ax.plot(x, y, marker="o", label="train reward (mean over rollouts)")
  if len(sd) == len(y):
    ax.fill_between(x, [a - b for a, b in zip(y, sd)], [a + b for a, b in zip(y, sd)], alpha=0.2)
  if ev:
    ax.plot(*_series(ev, "reward/mean"), marker="s", label="held-out eval")
  ax.set(xlabel="RL step", ylabel="reward", title="reward", ylim=(-0.05, 1.05))
  ax.legend(loc="lower right")
  if sft:
    axes[0][1].plot(*_series(sft, "nll"))
    axes[0][1].set(xlabel="SFT step", ylabel="token NLL", title="cold-start SFT", yscale="log")
  fig.tight_layout()
  written.append(out_dir / "reward.png")
  fig.savefig(written[-1], dpi=100)
  plt.close(fig)
  keys = [k for k in LEARNER_KEYS if any(k in r for r in rl)]
  if keys:
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3), squeeze=False)
    for ax, k in zip(axes[0], keys):
      ax.plot(*_series(rl, k))
      ax.set(xlabel="RL step", title=k)
    fig.tight_layout()
    written.append(out_dir / "learner.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
  return written
