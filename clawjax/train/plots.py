"""A run's metrics.jsonl -> PNG curves: reward.png (RL reward per step, one line per harness where the run
has several, held-out eval if any, SFT loss) and learner.png (entropy, KL, clip and TIS-truncation
fractions, grad norm, the learner's log-prob gap to the engine). The metrics each panel draws are the run
report's charts (clawjax/report/charts.py)."""

from __future__ import annotations

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from clawjax.report.charts import CHARTS, Chart, draw, read_metrics, series  # pylint: disable=wrong-import-position

_CHARTS = {c.title: c for c in CHARTS}
REWARD, HELD_OUT, SFT_LOSS = (_CHARTS[t] for t in ("reward (mean, per harness)", "held-out evaluation",
                                                    "cold-start SFT loss"))
LEARNER = tuple(_CHARTS[t] for t in ("entropy", "KL", "clip fraction", "TIS truncation", "grad norm",
                                     "log-prob gap, learner vs engine"))
MEAN = "reward/mean"
MEAN_LABELS = ("train reward", "all rollouts")  # the RL mean's label: one harness, several
HELD_OUT_LABEL = "held-out eval"


def reward_lines(rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
  """reward.png's lines: label -> (steps, rewards): the RL mean over all rollouts, each harness's mean where
  the run has several (a run of one harness has one line: its mean is the mean), the held-out mean."""
  lines = series(rows, REWARD)
  mean = lines.pop(MEAN, None)
  out = {MEAN_LABELS[len(lines) > 1]: mean} if mean else {}
  if len(lines) > 1:
    out.update({name.split("/")[1]: xy for name, xy in lines.items()})  # reward_harness/<harness>/mean
  held_out = series(rows, HELD_OUT).get(MEAN)
  return {**out, **({HELD_OUT_LABEL: held_out} if held_out else {})}


def _reward_panel(ax: plt.Axes, rows: list[dict]) -> None:
  std = {r["step"]: r["reward/std"] for r in rows if r.get("phase") == "rl" and "reward/std" in r}
  for label, (x, y) in reward_lines(rows).items():
    if label in MEAN_LABELS:  # with +-1 std around it
      ax.plot(x, y, marker="o", color="black", label=f"{label} (mean, +-1 std)")
      if all(s in std for s in x):
        ax.fill_between(x, [v - std[s] for s, v in zip(x, y)], [v + std[s] for s, v in zip(x, y)],
                        color="black", alpha=0.12)
    else:
      ax.plot(x, y, marker="s" if label == HELD_OUT_LABEL else ".", label=label)
  ax.set(xlabel="RL step", ylabel="reward", title="reward", ylim=(-0.05, 1.05))
  ax.legend(loc="lower right", fontsize=8)


def _panel(ax: plt.Axes, chart: Chart, lines: dict[str, tuple[list[int], list[float]]]) -> None:
  draw(ax, chart, lines)
  ax.title.set_fontsize(10)  # (a panel is 3.2 inches wide)


def _save(fig: plt.Figure, path: pathlib.Path) -> pathlib.Path:
  fig.savefig(path, dpi=100, bbox_inches="tight")  # (a title wider than its panel is kept whole)
  plt.close(fig)
  return path


def plot_run(workdir: str | pathlib.Path, out_dir: str | pathlib.Path | None = None) -> list[pathlib.Path]:
  """Writes the PNGs (into `out_dir`, default the run dir); returns their paths."""
  workdir = pathlib.Path(workdir)
  out_dir = pathlib.Path(out_dir or workdir)
  rows = read_metrics(workdir)
  sft = series(rows, SFT_LOSS)
  if not (any(r.get("phase") == "rl" for r in rows) or sft):
    raise ValueError(f"{workdir}: no metrics to plot")
  out_dir.mkdir(parents=True, exist_ok=True)
  fig, axes = plt.subplots(1, 2 if sft else 1, figsize=(11 if sft else 6, 4), squeeze=False, layout="constrained")
  _reward_panel(axes[0][0], rows)
  if sft:
    _panel(axes[0][1], SFT_LOSS, sft)
  written = [_save(fig, out_dir / "reward.png")]
  learner = [(c, lines) for c in LEARNER if (lines := series(rows, c))]
  if learner:
    fig, axes = plt.subplots(1, len(learner), figsize=(3.2 * len(learner), 3), squeeze=False, layout="constrained")
    for ax, (chart, lines) in zip(axes[0], learner):
      _panel(ax, chart, lines)
    written.append(_save(fig, out_dir / "learner.png"))
  return written
