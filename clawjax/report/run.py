"""A run directory -> WORKDIR/report.html: one self-contained page (inline CSS and SVG, no network) saying
what the run did, and the rollout-tree viewer of its last step's rollouts beside it.

  write_report(workdir, tokenizer=None) -> the report's path

Sections: the run's summary (summary.json; an evaluation's scores per category), the config
(config.json) and environment (environment.json), the curves (charts.py, from metrics.jsonl), and the
rollouts of the last training step (WORKDIR/steps/step_<k>/) or of the evaluation (WORKDIR/rollouts*.jsonl):
failures counted by reason with the harness's last stderr line, and the best and worst rollouts by reward,
each linking to its tree in WORKDIR/report/<name>.html (clawjax/tree/view.py). Tokens are decoded with
`tokenizer` (a tokenizer name or model directory), by default the run's own: config.json's
`model.template`, else `model.init`.
"""

from __future__ import annotations

import collections
import html
import json
import logging
import os
import pathlib
import re
import urllib.parse
from typing import Any

from clawjax import calllog
from clawjax.calllog import RolloutRecord
from clawjax.models.vocab import text_source
from clawjax.report.charts import charts
from clawjax.text.tokenizer import load_tokenizer
from clawjax.tree.view import Pieces, failure_of, load_views, token_pieces, viewer_html

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
TREES_DIR = "report"  # the viewer pages the report links to
SHOWN = 3  # best and worst rollouts listed


def _json(path: pathlib.Path) -> Any:
  if not path.is_file():
    return None
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except ValueError as e:
    raise ValueError(f"{path}: not JSON ({e})") from None


def _pieces(workdir: pathlib.Path, tokenizer: str | None) -> tuple[Pieces | None, str]:
  """The decoder of the run's tokens, and a note on where it came from (or why there is none)."""
  if tokenizer is None:
    model = (_json(workdir / "config.json") or {}).get("model") or {}
    tokenizer = model.get("template") or model.get("init")
  if not tokenizer:
    return None, "tokens shown as ids: the run names no model or tokenizer"
  try:
    return token_pieces(load_tokenizer(text_source(tokenizer)).hf), f"tokens decoded with {tokenizer}"
  except (ValueError, OSError) as e:
    return None, f"tokens shown as ids: no tokenizer for {tokenizer!r} ({e})"


def _last_step(workdir: pathlib.Path) -> tuple[str, list[pathlib.Path]] | None:
  """(name, rollout-record files) of the rollouts to show: the last RL step's (an asynchronous run's step
  lists its groups in groups.json), or an evaluation's."""
  # (A multi-process run's files carry their process: rollouts.process_<i>.jsonl, groups.process_<i>.json.)
  steps = [(int(m.group(1)), p) for p in workdir.glob("steps/step_*") if (m := re.fullmatch(r"step_(\d+)", p.name))
           and (any(p.glob("rollouts*.jsonl")) or any(p.glob("groups*.json")))]
  if steps:
    k, step_dir = max(steps)
    if any(step_dir.glob("rollouts*.jsonl")):
      return f"step_{k}", sorted(step_dir.glob("rollouts*.jsonl"))
    trained = [g for f in sorted(step_dir.glob("groups*.json")) for g in _json(f).get("trained", [])]
    return f"step_{k}", [p for g in trained for p in workdir.glob(f"groups/**/{g}.jsonl")]
  if any(workdir.glob("rollouts*.jsonl")):
    return "rollouts", sorted(workdir.glob("rollouts*.jsonl"))
  return None


def _table(columns: list[str], rows: list[list[Any]], id_: str = "") -> str:
  head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
  body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, _Html) else html.escape(_cell(c))}</td>" for c in row)
                 + "</tr>" for row in rows)
  return f'<table{f" id={id_!r}" if id_ else ""}><tr>{head}</tr>{body}</table>'


class _Html(str):
  """Markup that `_table` puts in a cell as it is."""


def _cell(v: Any) -> str:
  if v is None:
    return "-"
  return f"{v:.3f}" if isinstance(v, float) else str(v)


def _link(href: str, text: str) -> _Html:
  return _Html(f'<a href="{html.escape(href)}">{html.escape(text)}</a>')


def _rollouts_section(workdir: pathlib.Path, tokenizer: str | None) -> str:
  found = _last_step(workdir)
  if found is None:
    return "<p>No rollout records yet.</p>"
  name, paths = found
  records = [r for path in paths for r in calllog.iter_records(path) if isinstance(r, RolloutRecord)]
  pieces, note = _pieces(workdir, tokenizer)
  views = load_views(paths, workdir=workdir, pieces=pieces, errors="collect")
  page = workdir / TREES_DIR / f"{name}.html"
  page.parent.mkdir(parents=True, exist_ok=True)
  page.write_text(viewer_html(views, title=f"{workdir.name}: {name}"), encoding="utf-8")
  href = lambda rid: f"{TREES_DIR}/{name}.html#id={urllib.parse.quote(rid, safe='')}"
  out = [f"<h2>Rollouts of {html.escape(name)}</h2>",
         f"<p>{len(records)} rollouts, {sum(r.status == 'ok' for r in records)} ok; "
         f"{_link(f'{TREES_DIR}/{name}.html', 'all their trees')} ({html.escape(note)}).</p>"]
  failures = collections.Counter()
  for r in records:
    f = failure_of(r)
    if f:
      last = f["stderr_tail"].splitlines()[-1] if f["stderr_tail"] else ""
      failures[(r.status, f["reason"], f["checker_error"] or "", last)] += 1
  if failures:
    out.append("<h3>Failures by reason</h3>" + _table(
        ["rollouts", "status", "reason", "checker error", "last stderr line"],
        [[n, *key] for key, n in failures.most_common()], "failures"))
  scored = sorted((r for r in records if r.reward is not None), key=lambda r: -r.reward)
  for title, chosen, id_ in (("Best", scored[:SHOWN], "best"), ("Worst", scored[::-1][:SHOWN], "worst")):
    rows = [[_link(href(r.rollout_id), r.rollout_id), r.task_id, r.harness, r.reward,
             (r.extra or {}).get("n_calls"), (r.extra or {}).get("wall_s")] for r in chosen]
    out.append(f"<h3>{title} rollouts</h3>" + _table(["rollout", "task", "harness", "reward", "calls", "wall s"],
                                                      rows, id_))
  return "\n".join(out)


def _summary_section(workdir: pathlib.Path) -> str:
  summary = _json(workdir / "summary.json")
  if summary is None:
    return "<p>No summary.json (the run has not finished).</p>"
  out = []
  if "overall" in summary:  # an evaluation (clawjax/evaluation/report.py)
    groups = [*summary.get("categories", {}).values(), summary["overall"]]
    out.append(f"<p>{html.escape(str(summary.get('benchmark')))}: {html.escape(str(summary.get('harness')))} / "
               f"{html.escape(str(summary.get('model_label')))}</p>")
    out.append(_table(["category", "tasks", "rollouts", "statuses", "score (%)"],
                      [[g["name"], g["tasks"], g["rollouts"], json.dumps(g["statuses"]), g["score"]] for g in groups],
                      "evaluation"))
    summary = {k: v for k, v in summary.items() if k not in ("overall", "categories")}
  out.append(_table(["", "value"], [[k, json.dumps(v) if isinstance(v, (dict, list)) else v]
                                    for k, v in summary.items()], "summary"))
  return "\n".join(out)


def _details(title: str, obj: Any) -> str:
  if obj is None:
    return ""
  text = html.escape(json.dumps(obj, indent=2))
  return f"<details><summary>{html.escape(title)}</summary><pre>{text}</pre></details>"


def report_html(workdir: str | os.PathLike[str], tokenizer: str | None = None) -> str:
  workdir = pathlib.Path(workdir)
  drawn = charts(workdir)
  curves = "".join(f'<figure class="chart" data-title="{html.escape(c.title)}">{s}</figure>' for c, s in drawn)
  body = "\n".join([
      f"<h1>{html.escape(workdir.name)}</h1>",
      "<h2>Summary</h2>", _summary_section(workdir),
      "<h2>Config and environment</h2>",
      _details("config.json", _json(workdir / "config.json")) or "<p>No config.json.</p>",
      _details("run.json", _json(workdir / "run.json")),
      _details("environment.json", _json(workdir / "environment.json")),
      "<h2>Curves</h2>", f'<div id="charts">{curves}</div>' if drawn else "<p>No metrics.jsonl.</p>",
      _rollouts_section(workdir, tokenizer),
  ])
  return _PAGE.replace("__TITLE__", html.escape(workdir.name)).replace("__BODY__", body)


def write_report(workdir: str | os.PathLike[str], tokenizer: str | None = None) -> pathlib.Path:
  """Writes WORKDIR/report.html (and the tree pages it links to); returns its path."""
  path = pathlib.Path(workdir) / REPORT_FILE
  path.write_text(report_html(workdir, tokenizer), encoding="utf-8")
  log.info("report: %s", path)
  return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:14px;color:#222}
table{border-collapse:collapse;font-size:12px;margin:4px 0 10px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:6px;max-height:30em;overflow:auto}
#charts{display:flex;flex-wrap:wrap;gap:6px}
figure.chart{margin:0;border:1px solid #eee}
figure.chart svg{width:460px;height:280px}
</style></head>
<body>
__BODY__
</body></html>
"""
