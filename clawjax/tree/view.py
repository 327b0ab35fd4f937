"""The rollout-tree viewer: a call log's rollouts as one self-contained HTML page (inline JS and CSS, no
network), readable offline and attachable to a report.

A rollout is drawn as the prefix tree of *all* its calls (the kept ones and the dropped ones): a node is
a token segment of the trie (clawjax.tree.build), cut at every call's input and output end, so each
call's sampled output is a node of its own and a trunk shared by several leaves is one node with several
children. Each node says its role (main, compaction, subagent, auxiliary, a retry dead end, a failed
call, drift) and whether it is kept or dropped with the filter's reason (clawjax.tree.filters). Clicking
a node shows its tokens one by one (decoded where a tokenizer is given) with the loss mask (a token
enters the loss iff the kept tree has it sampled by a kept call, as the learner sees it), the rollout
log-prob of whichever call sampled it, and where the step data give them the rollout's advantage and
the learner's pi_old log-prob and TIS weight (truncated ones marked).

Above the tree: the rollout's header (task, harness, status and why it failed, score code / rubric /
final, calls, tokens, dedup ratio, wall time) and a list of all rollouts of the page sorted by reward,
each linking to its tree (`#r=<index>`; `#id=<rollout id>` from outside). Node payloads are embedded as
one JSON script element per node and parsed only when the node is clicked: a page of 40-call, 64K-token
rollouts draws their trees without decoding any token text.

  page = viewer_html([rollout_view(filtered, record, pieces=decode)], title="step 3")
"""

from __future__ import annotations

import collections
import dataclasses
import html
import json
import os
import pathlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from clawjax import calllog
from clawjax.calllog import CallRecord, RolloutRecord
from clawjax.tree.batch import ADVANTAGES_FILE, LEARNER_FILE
from clawjax.tree.build import ROOT, Trie, call_arrays
from clawjax.tree.filters import TRAIN, FilterConfig, FilteredRollout, filter_rollout
from clawjax.tree.summary import summarize

# Token ids -> one display string per token (a tokenizer's decode of each id on its own).
Pieces = Callable[[Sequence[int]], list[str]]
# (call_index that sampled a loss token, its depth) -> (learner's pi_old log-prob, TIS weight, truncated?)
LearnerTokens = Mapping[tuple[int, int], tuple[float, float, int]]



def token_pieces(tokenizer: Any) -> Pieces:
  """Pieces from a `tokenizers.Tokenizer`: each id decoded on its own, special tokens verbatim."""
  return lambda ids: tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


STDERR_LINES = 12  # of a failed rollout's stderr tail shown in its header


@dataclasses.dataclass
class _Node:
  trie_id: int
  parent: int            # index into the node list, -1 for the top
  level: int             # nodes above it
  start: int             # depth of its first token
  tokens: np.ndarray
  owner: np.ndarray      # int32: the kept call that trains the token; -1 where none does
  passing: list[int]     # call_index of every call whose path holds the node
  ends: list[int] = dataclasses.field(default_factory=list)  # calls whose input or output ends here
  children: list[int] = dataclasses.field(default_factory=list)


def _role(f: FilteredRollout, call: CallRecord) -> str:
  return call.role or f.inferred.get(call.call_index) or "main"


def failure_of(record: RolloutRecord | None) -> dict[str, Any] | None:
  """Why a rollout has no reward (the runner's reason, the harness's exit code and stderr tail), or why
  its reward is a checker's or judge's failure (scored 0 with the error); None otherwise."""
  if record is None:
    return None
  extra = record.extra or {}
  score = extra.get("score") or {}
  if record.status == "ok" and not score.get("error"):
    return None
  stderr = [line for line in str(extra.get("stderr_tail") or "").splitlines() if line.strip()]
  reason = extra.get("reason") or ("the checker or judge failed (scored 0)" if record.status == "ok"
                                   else "no reason recorded")
  return {"reason": reason, "exit_code": extra.get("exit_code"), "checker_error": score.get("error"),
          "sandbox": extra.get("sandbox"), "stderr_tail": "\n".join(stderr[-STDERR_LINES:])}


def _header(f: FilteredRollout, record: RolloutRecord | None, advantage: float | None) -> dict[str, Any]:
  summary = summarize(f)
  calls = f.calls
  extra = (record.extra if record else None) or {}
  score = extra.get("score") or {}
  wall = extra.get("wall_s")
  if wall is None and calls:
    wall = max(c.t_end for c in calls) - min(c.t_start for c in calls)
  first = calls[0] if calls else None
  return {
      "rollout_id": f.rollout_id,
      "task": record.task_id if record else first.task_id if first else None,
      "harness": record.harness if record else first.harness if first else None,
      "status": record.status if record else "no rollout record",
      "reward": record.reward if record else None,
      "score": {k: score.get(k) for k in ("code_score", "rubric_score", "final_score")},
      "advantage": advantage,
      "calls": len(calls), "trained_calls": summary["trained_calls"], "dropped": summary["dropped"],
      "over_branching": f.over_branching, "leaves": f.leaves, "drift_calls": f.drift_calls,
      "call_tokens": sum(len(c.input_ids) + len(c.output_ids) for c in calls),
      "unique_tokens": summary["unique_tokens"], "loss_tokens": summary["loss_tokens"],
      "dedup_ratio": summary["path_tokens"] / summary["unique_tokens"] if summary["unique_tokens"] else None,
      "wall_s": wall, "failure": failure_of(record),
      "call_list": [{"index": c.call_index, "role": _role(f, c), "status": c.status,
                     "reason": f.reasons[c.call_index], "input": len(c.input_ids), "output": len(c.output_ids),
                     "finish": c.finish_reason, "error": (c.extra or {}).get("error"),
                     "drift": c.call_index in f.drifted} for c in calls],
  }


def _nodes(f: FilteredRollout) -> tuple[list[_Node], dict[int, tuple[int, int]]]:
  """The trie of every call, flattened in depth-first order; and each call's (input, output) span."""
  trie = Trie()
  trained = not f.over_branching
  spans: dict[int, tuple[int, int]] = {}
  ends: dict[int, int] = {}
  for c in f.calls:
    seq, lp = call_arrays(c)
    n_in = len(c.input_ids)
    if c.status != "ok":  # a failed call: its input only, never sampled
      seq = seq[:n_in]
    claim = trained and f.reasons[c.call_index] == TRAIN
    _, end = trie.insert(seq, cuts=(n_in, len(seq)), owner=c.call_index,
                         sampled_from=n_in if claim else None, logprobs=lp)
    spans[c.call_index] = (n_in, len(seq))
    ends[c.call_index] = end
  index: dict[int, int] = {}
  nodes: list[_Node] = []
  stack = [(n, -1, 0) for n in reversed(list(trie.children[ROOT].values()))]
  while stack:
    n, parent, level = stack.pop()
    index[n] = len(nodes)
    nodes.append(_Node(n, parent, level, trie.start[n], trie.tokens[n], trie.owner[n], []))
    if parent >= 0:
      nodes[parent].children.append(index[n])
    stack.extend((m, index[n], level + 1) for m in reversed(list(trie.children[n].values())))
  for ci, end in ends.items():
    if end != ROOT:
      nodes[index[end]].ends.append(ci)
    for n in trie.path_nodes(end):
      nodes[index[n]].passing.append(ci)
  return nodes, spans


def _describe(f: FilteredRollout, node: _Node, nodes: list[_Node], spans: dict[int, tuple[int, int]]
              ) -> tuple[dict[str, Any], int | None]:
  """The node's drawing record, and the call that sampled its tokens (None: context)."""
  calls = {c.call_index: c for c in f.calls}
  end = node.start + len(node.tokens)
  samplers = [ci for ci in node.passing if spans[ci][0] <= node.start and end <= spans[ci][1]
              and calls[ci].status == "ok"]
  sampler = min(samplers) if samplers else None
  reasons = collections.Counter(f.reasons[ci] for ci in node.passing)
  kept = not f.over_branching and reasons[TRAIN] > 0
  if kept:
    why = None
  elif f.over_branching:
    why = "over_branching"
  else:
    why = ", ".join(sorted(reasons))
  owner = sampler if sampler is not None else min(node.passing)
  role = _role(f, calls[owner])
  if not kept and set(reasons) == {"retry"}:
    role = "retry"
  elif not kept and set(reasons) == {"error"}:
    role = "error"
  # Drift shows where a drift call's input leaves an earlier call's path inside that call's output.
  first = min(node.passing)
  above = nodes[node.parent].passing if node.parent >= 0 else list(spans)
  drift = first in f.drifted and node.start < spans[first][0] and any(
      e < first and e not in node.passing and spans[e][0] <= node.start < spans[e][1] for e in above)
  return {"parent": node.parent, "level": node.level, "start": node.start, "length": len(node.tokens),
          "role": role, "kept": kept, "why": why, "sampled_by": sampler, "calls": node.passing,
          "ends": node.ends, "drift": drift, "loss_tokens": int((node.owner >= 0).sum())}, sampler


def rollout_view(filtered: FilteredRollout, record: RolloutRecord | None = None, *,
                 pieces: Pieces | None = None, advantage: float | None = None,
                 learner: LearnerTokens | None = None) -> dict[str, Any]:
  """One rollout's page data: header, node records, and each node's token payload (a JSON string).

  `pieces` decodes the tokens (ids only without it); `advantage` is the rollout's advantage in its
  step (GRPO: one value for all its loss tokens); `learner` the learner's view of its loss tokens."""
  nodes, spans = _nodes(filtered)
  calls = {c.call_index: c for c in filtered.calls}
  drawn, payloads = [], []
  for node in nodes:
    info, sampler = _describe(filtered, node, nodes, spans)
    drawn.append(info)
    logp = None
    if sampler is not None:
      offset = node.start - spans[sampler][0]
      logp = [round(float(x), 5) for x in calls[sampler].output_logprobs[offset:offset + len(node.tokens)]]
    ids = node.tokens.tolist()
    seen = None
    if learner and info["loss_tokens"]:
      seen = [learner.get((int(o), node.start + k)) if o >= 0 else None for k, o in enumerate(node.owner)]
    column = lambda j: [s[j] if s else None for s in seen] if seen else None
    payloads.append(json.dumps({
        "ids": ids, "text": pieces(ids) if pieces else None, "loss": (node.owner >= 0).astype(int).tolist(),
        "logp": logp, "advantage": advantage if info["loss_tokens"] else None,
        "old": column(0), "tis": column(1), "trunc": column(2)}, ensure_ascii=False))
  return {"header": _header(filtered, record, advantage), "nodes": drawn, "payloads": payloads}


def _run_records(workdir: pathlib.Path) -> Iterable[pathlib.Path]:
  """The rollout-record files of a run directory: a training run's steps (or groups, when asynchronous),
  its held-out evaluations, an evaluation's rollouts."""
  # (A multi-process run's files carry their process: rollouts.process_<i>.jsonl, groups/process_<i>/.)
  yield from sorted(workdir.glob("steps/step_*/rollouts*.jsonl"))
  yield from sorted(workdir.glob("groups/**/*.jsonl"))
  yield from sorted(workdir.glob("eval/step_*.jsonl"))
  if (workdir / "rollouts.jsonl").is_file():
    yield workdir / "rollouts.jsonl"


def _step_files(workdir: pathlib.Path, name: str) -> Iterable[Any]:
  stem, _, suffix = name.partition(".")
  for path in sorted(workdir.glob(f"steps/step_*/{stem}*.{suffix}")):
    try:
      yield json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
      raise ValueError(f"{path}: not JSON ({e})") from None


def _advantages(workdir: pathlib.Path) -> dict[str, float]:
  return {rid: a for step in _step_files(workdir, ADVANTAGES_FILE) for rid, a in step.items()}


def _learner_tokens(workdir: pathlib.Path) -> dict[str, LearnerTokens]:
  return {rid: {(int(c), int(d)): (lp, w, t) for c, d, lp, w, t in rows}
          for step in _step_files(workdir, LEARNER_FILE) for rid, rows in step["rollouts"].items()}


def load_views(paths: Sequence[str | os.PathLike[str]], *, workdir: str | os.PathLike[str] | None = None,
               rollout_ids: Sequence[str] = (), pieces: Pieces | None = None,
               config: FilterConfig = FilterConfig(), errors: str = "raise") -> list[dict[str, Any]]:
  """`rollout_view`s of the rollouts in call-log files or directories `paths` (all, or `rollout_ids`).

  With a run directory `workdir` (experiments/train.py or eval.py): a rollout record's calls come from
  WORKDIR/calls/<id>.jsonl, a call log's rollout records from the run's record files, and each
  rollout's advantage from its step's ADVANTAGES_FILE, its learner log-probs from LEARNER_FILE."""
  files = [pathlib.Path(p) for p in paths]
  log = calllog.load(files, errors=errors)
  advantages: dict[str, float] = {}
  learner: dict[str, LearnerTokens] = {}
  if workdir is not None:
    run = pathlib.Path(workdir)
    records = {r.rollout_id: r for f in _run_records(run) for r in calllog.iter_records(f)
               if isinstance(r, RolloutRecord)}
    wanted = set(rollout_ids) or set(log.rollout_ids())
    more = [p for rid in sorted(wanted - set(log.calls)) for p in run.glob(f"calls/**/{rid}.jsonl")]
    if more:
      log = calllog.load(files + more, errors=errors)
    for rid in wanted & set(records) - set(log.rollouts):
      log.rollouts[rid] = records[rid]
    advantages, learner = _advantages(run), _learner_tokens(run)
  ids = list(rollout_ids) or log.rollout_ids()
  unknown = [rid for rid in ids if rid not in log.calls and rid not in log.rollouts]
  if unknown:
    raise ValueError(f"rollouts {unknown} are in none of {[str(f) for f in files]}")
  return [rollout_view(filter_rollout(rid, log.calls.get(rid, []), config), log.rollouts.get(rid),
                       pieces=pieces, advantage=advantages.get(rid), learner=learner.get(rid)) for rid in ids]


def _script_json(obj: Any) -> str:
  """JSON that is safe inside a <script> element (no "</script>", no "<!--")."""
  text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
  return text.replace("<", "\\u003c")


def _sort_key(view: dict[str, Any]) -> tuple[bool, float]:
  reward = view["header"]["reward"]
  return reward is None, -(reward if reward is not None else 0.0)


def viewer_html(views: Sequence[dict[str, Any]], title: str = "rollouts") -> str:
  """The page for `rollout_view` records: the list view (sorted by reward, best first) and one tree at a
  time (`#r=<index>`, default the first of the list)."""
  views = sorted(views, key=_sort_key)
  meta = [{"header": v["header"], "nodes": v["nodes"]} for v in views]
  parts = [f'<script type="application/json" id="p{r}_{n}">{_script_json(p)}</script>'
           for r, v in enumerate(views) for n, p in enumerate(v["payloads"])]
  return (_PAGE.replace("__TITLE__", html.escape(title))
          .replace("__META__", _script_json(meta))
          .replace("__PAYLOADS__", "\n".join(parts)))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{padding:8px 14px;background:#f3f3f3;border-bottom:1px solid #ccc}
h1{font-size:16px;margin:0}
main{display:flex;gap:0;height:calc(100vh - 40px)}
#left{width:58%;overflow:auto;border-right:1px solid #ccc;padding:8px}
#right{flex:1;overflow:auto;padding:8px}
table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
tr.sel{background:#fff6c8}
.k{color:#666}
pre{white-space:pre-wrap;background:#fbeaea;padding:6px;max-height:14em;overflow:auto}
svg text{font:11px system-ui,sans-serif;pointer-events:none}
svg rect{cursor:pointer;stroke-width:1.5}
svg rect.dropped{stroke-dasharray:4 3;fill-opacity:.35}
svg rect.sel{stroke:#000;stroke-width:3}
.tok{border-right:1px dotted #ccc;white-space:pre-wrap;font-family:monospace}
.tok.loss{background:#d8f5d0}
.tok.trunc{text-decoration:underline wavy #c0392b}
.legend span{display:inline-block;padding:0 6px;margin-right:4px;border-radius:3px}
</style></head>
<body>
<header><h1>__TITLE__</h1></header>
<main><div id="left"><div id="list"></div><div id="head"></div><div class="legend" id="legend"></div>
<div id="tree"></div></div><div id="right"><div id="node">Click a node to see its tokens.</div></div></main>
<script type="application/json" id="meta">__META__</script>
__PAYLOADS__
<script>
"use strict";
const META = JSON.parse(document.getElementById("meta").textContent);
const COLORS = {main:"#4c8bf5", compaction:"#f5a623", subagent:"#9b59b6", auxiliary:"#7f8c8d",
                retry:"#e74c3c", error:"#c0392b"};
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function fmt(x, d) {
  if (x === null || x === undefined) return "-";
  return typeof x === "number" ? x.toFixed(d === undefined ? 3 : d) : String(x);
}
function row(tbl, cells, tag) {
  const tr = el("tr");
  for (const c of cells) {
    if (c instanceof Node) { const td = el(tag || "td"); td.appendChild(c); tr.appendChild(td); }
    else tr.appendChild(el(tag || "td", {}, c));
  }
  tbl.appendChild(tr); return tr;
}
function current() {
  const byId = /#id=(.+)/.exec(location.hash);
  if (byId) {
    const r = META.findIndex(v => v.header.rollout_id === decodeURIComponent(byId[1]));
    return r < 0 ? 0 : r;
  }
  const m = /#r=(\\d+)/.exec(location.hash); const r = m ? +m[1] : 0; return r < META.length ? r : 0;
}
function renderList(sel) {
  const box = document.getElementById("list"); box.replaceChildren(el("h2", {}, META.length + " rollouts, by reward"));
  const t = el("table", {id: "rollouts"});
  row(t, ["rollout", "task", "harness", "status", "reward", "calls", "trained", "dropped", "why it failed"], "th");
  META.forEach((v, i) => {
    const h = v.header, a = el("a", {href: "#r=" + i}, h.rollout_id);
    const dropped = Object.entries(h.dropped).filter(([k, n]) => n).map(([k, n]) => k + " " + n).join(", ");
    const tr = row(t, [a, h.task, h.harness, h.status, fmt(h.reward), h.calls, h.trained_calls,
                       (h.over_branching ? "over-branching; " : "") + dropped, h.failure ? h.failure.reason : ""]);
    if (i === sel) tr.className = "sel";
  });
  box.appendChild(t);
}
function renderHead(h) {
  const box = document.getElementById("head"); box.replaceChildren(el("h2", {}, h.rollout_id));
  const t = el("table", {id: "header"});
  const s = h.score;
  for (const [k, v] of [["task", h.task], ["harness", h.harness], ["status", h.status], ["reward", fmt(h.reward)],
      ["score code / rubric / final", fmt(s.code_score) + " / " + fmt(s.rubric_score) + " / " + fmt(s.final_score)],
      ["advantage", fmt(h.advantage)], ["calls (trained)", h.calls + " (" + h.trained_calls + ")"],
      ["tokens: calls / unique kept / loss", h.call_tokens + " / " + h.unique_tokens + " / " + h.loss_tokens],
      ["dedup ratio", fmt(h.dedup_ratio, 2)],
      ["leaves", h.leaves + (h.over_branching ? " (over-branching: dropped whole)" : "")],
      ["drift calls", h.drift_calls], ["wall time", fmt(h.wall_s, 1) + " s"]]) row(t, [k, v]);
  box.appendChild(t);
  if (h.failure) {
    const f = h.failure;
    const exit = f.exit_code !== null && f.exit_code !== undefined ? " (exit " + f.exit_code + ")" : "";
    box.appendChild(el("p", {id: "failure"}, "Failed: " + f.reason + exit +
                       (f.checker_error ? "; checker: " + f.checker_error : "") +
                       (f.sandbox ? "; sandbox " + f.sandbox : "")));
    if (f.stderr_tail) box.appendChild(el("pre", {}, f.stderr_tail));
  }
  const c = el("table", {id: "calls"});
  row(c, ["call", "role", "status", "filter", "input", "output", "finish", "note"], "th");
  for (const x of h.call_list) row(c, [x.index, x.role, x.status, x.reason, x.input, x.output, x.finish || "",
                                      (x.drift ? "drift " : "") + (x.error || "")]);
  box.appendChild(c);
}
function renderLegend() {
  const box = document.getElementById("legend"); box.replaceChildren();
  for (const [k, v] of Object.entries(COLORS)) box.appendChild(el("span", {style: "background:" + v + "55"}, k));
  box.appendChild(el("span", {style: "border:1px dashed #555"}, "dropped"));
  box.appendChild(el("span", {style: "border:2px solid #d35400"}, "drift"));
}
function renderTree(r) {
  const nodes = META[r].nodes, W = 150, H = 38, BW = 136, BH = 26;
  const x = new Array(nodes.length); let col = 0;
  // Leaves take columns in depth-first order; a parent sits above the middle of its children.
  for (let i = nodes.length - 1; i >= 0; i--) x[i] = null;
  const kids = nodes.map(() => []); nodes.forEach((n, i) => { if (n.parent >= 0) kids[n.parent].push(i); });
  const place = (i) => { if (!kids[i].length) { x[i] = col++; return; } kids[i].forEach(place);
    x[i] = (x[kids[i][0]] + x[kids[i][kids[i].length - 1]]) / 2; };
  nodes.forEach((n, i) => { if (n.parent < 0) place(i); });
  const depth = Math.max(0, ...nodes.map(n => n.level)) + 1;
  const s = svg("svg", {width: Math.max(1, col) * W + 20, height: depth * H + 20, id: "treesvg"});
  nodes.forEach((n, i) => { if (n.parent >= 0) s.appendChild(svg("line", {x1: 10 + x[n.parent] * W + BW / 2,
    y1: 10 + nodes[n.parent].level * H + BH, x2: 10 + x[i] * W + BW / 2, y2: 10 + n.level * H, stroke: "#999"})); });
  nodes.forEach((n, i) => {
    const g = svg("g", {class: "node", "data-node": i, "data-kept": n.kept ? "1" : "0", "data-role": n.role});
    const rect = svg("rect", {x: 10 + x[i] * W, y: 10 + n.level * H, width: BW, height: BH, rx: 4,
      fill: COLORS[n.role] || "#bbb", stroke: n.drift ? "#d35400" : (COLORS[n.role] || "#888"),
      class: n.kept ? "kept" : "dropped"});
    const label = (n.sampled_by !== null ? "call " + n.sampled_by + " out" : "context") + " · " + n.length + " tok" +
                  (n.kept ? "" : " ✗ " + n.why);
    const t = svg("text", {x: 14 + x[i] * W, y: 27 + n.level * H}); t.textContent = label.slice(0, 26);
    const tip = svg("title"); tip.textContent = label + "; calls " + n.calls.join(",") + (n.drift ? "; drift" : "");
    rect.appendChild(tip);
    rect.addEventListener("click", () => showNode(r, i, rect));
    g.appendChild(rect); g.appendChild(t); s.appendChild(g);
  });
  document.getElementById("tree").replaceChildren(el("h3", {}, nodes.length + " nodes, " +
      nodes.filter((n, i) => !kids[i].length && !n.kept).length + " dropped branches"), s);
}
function showNode(r, i, rect) {
  document.querySelectorAll("svg rect.sel").forEach(e => e.classList.remove("sel"));
  rect.classList.add("sel");
  const n = META[r].nodes[i], p = JSON.parse(document.getElementById("p" + r + "_" + i).textContent);
  const box = document.getElementById("node");
  box.replaceChildren(el("h3", {}, "node " + i + ": " + n.role + (n.kept ? ", kept" : ", dropped (" + n.why + ")") +
    (n.drift ? ", drift" : "")));
  box.appendChild(el("p", {}, "tokens at depth " + n.start + "-" + (n.start + n.length - 1) + "; sampled by " +
    (n.sampled_by === null ? "no call (context)" : "call " + n.sampled_by) +
    "; on the path of calls " + n.calls.join(", ") +
    "; loss tokens " + n.loss_tokens + (p.advantage !== null ? "; advantage " + fmt(p.advantage) : "")));
  const toks = el("div", {id: "tokens"});
  p.ids.forEach((id, k) => {
    const span = el("span", {class: "tok" + (p.loss[k] ? " loss" : "") + (p.trunc && p.trunc[k] ? " trunc" : ""),
                             "data-id": id},
                    p.text ? p.text[k] : "[" + id + "]");
    span.title = "id " + id + (p.logp ? "; rollout logp " + p.logp[k] : "") +
                 (p.loss[k] ? "; in the loss" : "; no loss") +
                 (p.loss[k] && p.advantage !== null ? "; advantage " + fmt(p.advantage) : "") +
                 (p.old && p.old[k] !== null ? "; learner logp " + p.old[k] + "; TIS w " + p.tis[k] +
                  (p.trunc[k] ? " (truncated)" : "") : "");
    toks.appendChild(span);
  });
  box.appendChild(toks);
  const t = el("table", {id: "tokentable"});
  row(t, ["#", "id", "text", "loss", "rollout logp", "learner logp", "TIS w", "advantage"], "th");
  const shown = Math.min(p.ids.length, 2000), has = (a, k) => a && a[k] !== null;
  for (let k = 0; k < shown; k++) row(t, [n.start + k, p.ids[k], p.text ? JSON.stringify(p.text[k]) : "",
    p.loss[k], p.logp ? p.logp[k] : "", has(p.old, k) ? p.old[k] : "",
    has(p.tis, k) ? p.tis[k] + (p.trunc[k] ? " truncated" : "") : "",
    p.loss[k] && p.advantage !== null ? fmt(p.advantage) : ""]);
  box.appendChild(t);
  if (shown < p.ids.length)
    box.appendChild(el("p", {}, "(table shows the first " + shown + " of " + p.ids.length + " tokens)"));
}
function render() {
  const r = current();
  renderList(r);
  if (!META.length) return;
  renderHead(META[r].header); renderLegend(); renderTree(r);
  document.getElementById("node").replaceChildren("Click a node to see its tokens.");
}
window.addEventListener("hashchange", render);
render();
</script></body></html>
"""
