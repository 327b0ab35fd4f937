"""A run's metrics.jsonl as inline SVG charts: reward per harness and per group, calls kept and dropped by
reason, over-branching, drift, TIS truncation, clip fraction, entropy, KL, grad norm, the learner's
log-prob gap to the engine, tokens/s, rollout vs learner time, the cold-start SFT loss and held-out
evaluation. (clawjax/train/plots.py draws the PNGs from the same charts.)"""

from __future__ import annotations

import dataclasses
import fnmatch
import io
import json
import os
import pathlib
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
from matplotlib.ticker import MaxNLocator  # pylint: disable=wrong-import-position

METRICS_FILE = "metrics.jsonl"  # the trainer's metrics (clawjax/train/metrics.py writes the format)


@dataclasses.dataclass(frozen=True)
class Chart:
  title: str
  phase: str                 # "rl" | "sft" | "eval"
  patterns: tuple[str, ...]  # metric names (fnmatch patterns) drawn as one line each
  ylabel: str = ""
  log: bool = False


CHARTS = (
    Chart("reward (mean, per harness)", "rl", ("reward/mean", "reward_harness/*/mean"), "reward"),
    Chart("reward per group (task, harness)", "rl", ("reward_group/*/mean",), "reward"),
    Chart("held-out evaluation", "eval", ("reward/mean", "ok_fraction")),
    Chart("calls by filter reason", "rl", ("count/calls_*",), "calls"),
    Chart("rollouts left out, by reason", "rl", ("count/status_*", "count/over_branching", "count/stale",
                                                 "count/too_long", "count/no_trained_calls", "count/no_record",
                                                 "count/unreadable", "count/reward_out_of_range",
                                                 "count/nonfinite_reward", "count/uninformative"), "rollouts"),
    Chart("over-branching rate", "rl", ("over_branching_rate",)),
    Chart("drift calls", "rl", ("drift_calls",)),
    Chart("tree dedup ratio", "rl", ("tree_dedup_ratio",)),
    Chart("TIS truncation", "rl", ("tis_truncated_fraction",), "fraction of tokens"),
    Chart("clip fraction", "rl", ("clip_fraction", "clip_fraction_last")),
    Chart("entropy", "rl", ("entropy",)),
    Chart("KL", "rl", ("approx_kl", "kl*")),
    Chart("grad norm", "rl", ("grad_norm*",)),
    # How far the learner's log-probs of the sampled tokens are from the engine's (should stay ~0 on-policy).
    Chart("log-prob gap, learner vs engine", "rl", ("mean_abs_logp_old_minus_rollout",), "mean |difference|"),
    Chart("tokens/s", "rl", ("tokens_per_s",)),
    Chart("wall time per step", "rl", ("rollout_s", "learner_s", "push_s"), "s"),
    Chart("cold-start SFT loss", "sft", ("nll",), "token NLL", log=True),
)


def read_metrics(workdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """Every line of WORKDIR/metrics.jsonl ([] without one); a bad line names the file and line."""
  path = pathlib.Path(workdir) / METRICS_FILE
  if not path.exists():
    return []
  rows = []
  for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
    if line.strip():
      try:
        rows.append(json.loads(line))
      except ValueError as e:
        raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
  return rows


def series(rows: list[dict[str, Any]], chart: Chart) -> dict[str, tuple[list[int], list[float]]]:
  """name -> (steps, values) of every metric of `chart` that the rows hold."""
  phase = [r for r in rows if r.get("phase") == chart.phase]
  names = sorted({k for r in phase for k in r if any(fnmatch.fnmatchcase(k, p) for p in chart.patterns)})
  out = {}
  for name in names:
    pts = sorted((r["step"], float(r[name])) for r in phase if name in r)
    out[name] = ([p[0] for p in pts], [p[1] for p in pts])
  return out


def draw(ax: plt.Axes, chart: Chart, lines: dict[str, tuple[list[int], list[float]]]) -> None:
  """The chart's lines on `ax`, with its title, axis labels and scale, and a legend naming them."""
  for name, (x, y) in lines.items():
    ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, label=name)
  ax.set(title=chart.title, xlabel=f"{chart.phase.upper()} step", ylabel=chart.ylabel)
  if chart.log:
    ax.set_yscale("log")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  if len(lines) > 1 or any("*" in p for p in chart.patterns):
    ax.legend(fontsize=6, loc="best")


def svg(chart: Chart, lines: dict[str, tuple[list[int], list[float]]]) -> str:
  """The chart as an inline <svg> element."""
  fig, ax = plt.subplots(figsize=(4.6, 2.8))
  draw(ax, chart, lines)
  fig.tight_layout()
  buf = io.StringIO()
  fig.savefig(buf, format="svg")
  plt.close(fig)
  text = buf.getvalue()
  return text[text.index("<svg"):]


def charts(workdir: str | os.PathLike[str]) -> list[tuple[Chart, str]]:
  """(chart, svg) for every chart the run has data for."""
  rows = read_metrics(workdir)
  return [(c, svg(c, lines)) for c in CHARTS if (lines := series(rows, c))]
