"""The rollout-tree viewer on the bundled sample log: node and dropped-branch counts against a naive token
trie, loss tokens and log-probs against the filters and the call records, and the page in a real headless
browser (no console errors, no network, the right nodes, a click shows the node's tokens)."""

import json
import pathlib

import pytest

from clawjax import calllog
from clawjax.calllog import RolloutRecord
from clawjax.tree.__main__ import main
from clawjax.tree.filters import TRAIN, filter_rollout
from clawjax.tree.summary import summarize
from clawjax.tree.view import load_views, rollout_view, viewer_html

from tests.browser import open_page
from tests.tree.test_tree_filters import expected_reason

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "clawjax" / "data" / "sample_calls.jsonl"


def naive_counts(calls, over_branching: bool) -> tuple[int, int]:
  """(nodes, dropped branches) of the trie of every call (a failed call: its input), one dict per token:
  a node ends where a call's input or output ends or the tokens branch; a leaf is dropped when no trained
  call ends there (or the rollout is dropped whole)."""
  root: dict = {}
  info = {}  # id(token node) -> [cut?, trained call ends here?]
  for c in calls:
    seq = list(c.input_ids) + (list(c.output_ids) if c.status == "ok" else [])
    node = root
    for depth, tok in enumerate(seq, start=1):
      node = node.setdefault(tok, {})
      mark = info.setdefault(id(node), [False, False, node])
      if depth in (len(c.input_ids), len(seq)):
        mark[0] = True
      if depth == len(seq) and expected_reason(c) == TRAIN:
        mark[1] = True
  nodes = sum(1 for cut, _, n in info.values() if cut or len(n) != 1)
  dropped = sum(1 for _, trained, n in info.values() if not n and (over_branching or not trained))
  return nodes, dropped


def test_nodes_loss_tokens_and_logprobs_match_references():
  log = calllog.load(SAMPLE)
  for rid, calls in log.calls.items():
    f = filter_rollout(rid, calls)
    view = rollout_view(f, log.rollouts[rid])
    nodes = view["nodes"]
    leaves = [i for i in range(len(nodes)) if not any(n["parent"] == i for n in nodes)]
    assert (len(nodes), sum(not nodes[i]["kept"] for i in leaves)) == naive_counts(calls, f.over_branching), rid
    assert sum(n["loss_tokens"] for n in nodes) == summarize(f)["loss_tokens"]
    by_index = {c.call_index: c for c in calls}
    for n, payload in zip(nodes, map(json.loads, view["payloads"])):
      if n["sampled_by"] is None:
        assert payload["logp"] is None and not any(payload["loss"])
        continue
      c = by_index[n["sampled_by"]]
      offset = n["start"] - len(c.input_ids)
      assert payload["ids"] == list(c.output_ids[offset:offset + n["length"]])
      assert payload["logp"] == pytest.approx(c.output_logprobs[offset:offset + n["length"]], abs=1e-5)
      assert n["kept"] == (not f.over_branching and any(f.reasons[i] == TRAIN for i in n["calls"]))
    assert view["header"]["reward"] == log.rollouts[rid].reward


def test_failed_rollout_says_why_and_bad_ids_are_named(tmp_path):
  record = RolloutRecord("r-failed", "t", "mini", None, "failed",
                         {"reason": "the harness made no model call (exit 1)", "exit_code": 1,
                          "stderr_tail": "Traceback...\nModuleNotFoundError: No module named 'foo'\n"})
  path = tmp_path / "rollouts.jsonl"
  with calllog.CallLogWriter(path) as writer:
    writer.write(record)
  (view,) = load_views([path])
  failure = view["header"]["failure"]
  assert failure["reason"] == "the harness made no model call (exit 1)"
  assert failure["stderr_tail"].endswith("ModuleNotFoundError: No module named 'foo'")
  with pytest.raises(ValueError, match="rollouts \\['nope'\\] are in none of"):
    load_views([path], rollout_ids=["nope"])


def test_viewer_page_in_a_headless_browser(tmp_path, capsys):
  out = tmp_path / "tree.html"
  assert main(["view", str(SAMPLE), "--out", str(out)]) == 0
  log = calllog.load(SAMPLE)
  by_reward = sorted(log.rollouts.values(), key=lambda r: -r.reward)
  with open_page(out) as (page, errors):
    listed = page.eval_on_selector_all("#rollouts tr td:first-child a", "e => e.map(a => a.textContent)")
    assert listed == [r.rollout_id for r in by_reward]  # the list view, best first
    for r, record in enumerate(by_reward):
      page.evaluate(f"location.hash = '#r={r}'")
      page.wait_for_function(f"document.querySelector('#head h2').textContent === {json.dumps(record.rollout_id)}")
      calls = log.calls[record.rollout_id]
      f = filter_rollout(record.rollout_id, calls)
      nodes, dropped = naive_counts(calls, f.over_branching)
      assert page.eval_on_selector_all("svg g.node", "e => e.length") == nodes
      assert page.inner_text("#tree h3") == f"{nodes} nodes, {dropped} dropped branches"
      assert page.eval_on_selector_all("svg rect[stroke='#d35400']", "e => e.length") == f.drift_calls
    # A click on the retry rollout's dropped output shows its tokens, none in the loss.
    r = next(i for i, rec in enumerate(by_reward) if rec.rollout_id == "fix-csv/claude_code/retry-error")
    page.evaluate(f"location.hash = '#r={r}'")
    page.wait_for_selector("svg g.node[data-role='retry']")
    node = int(page.get_attribute("svg g.node[data-role='retry']", "data-node"))
    page.click(f"svg g.node[data-node='{node}'] rect")
    (retry,) = [c for c in log.calls["fix-csv/claude_code/retry-error"] if expected_reason(c) == "retry"]
    ids = page.eval_on_selector_all("#tokens span", "e => e.map(s => +s.dataset.id)")
    assert ids == list(retry.output_ids)
    assert page.eval_on_selector_all("#tokens span.loss", "e => e.length") == 0
    assert "dropped (retry)" in page.inner_text("#node h3")
    assert errors == []


def test_a_large_rollout_loads_its_tokens_per_node(tmp_path):
  """A Claude Code-sized rollout (40 calls, ~64K unique tokens): the page embeds each node's tokens as its own
  JSON element, draws the tree without them, and a click on the longest node shows all its tokens."""
  import numpy as np
  from clawjax.tree import synthetic
  calls = synthetic.agent_rollout(np.random.default_rng(0), rollout_id="big", prompt_len=20_000, n_calls=40,
                                  tokens_per_call=1_100, patterns=("retry", "compaction"))
  f = filter_rollout("big", calls)
  assert f.tree.size > 60_000
  view = rollout_view(f)
  out = tmp_path / "big.html"
  out.write_text(viewer_html([view]))
  longest = max(range(len(view["nodes"])), key=lambda i: view["nodes"][i]["length"])
  with open_page(out) as (page, errors):
    assert page.eval_on_selector_all("script[type='application/json']", "e => e.length") == len(view["nodes"]) + 1
    assert page.eval_on_selector_all("svg g.node", "e => e.length") == naive_counts(calls, f.over_branching)[0]
    assert page.eval_on_selector_all("#tokens span", "e => e.length") == 0  # nothing decoded before a click
    page.click(f"svg g.node[data-node='{longest}'] rect")
    assert page.eval_on_selector_all("#tokens span", "e => e.length") == view["nodes"][longest]["length"]
    assert errors == []


def test_a_checker_crash_is_shown_with_its_error(tmp_path):
  record = RolloutRecord("r-crash", "t", "mini", 0.0, "ok", {
      "score": {"code_score": 0.0, "rubric_score": None, "final_score": 0.0,
                "error": "checker exited 1 (stderr: ImportError: cannot import name 'x')"}})
  path = tmp_path / "rollouts.jsonl"
  with calllog.CallLogWriter(path) as writer:
    writer.write(record)
  (view,) = load_views([path])
  assert view["header"]["failure"]["checker_error"].startswith("checker exited 1")
  out = tmp_path / "page.html"
  out.write_text(viewer_html([view]))
  with open_page(out) as (page, errors):
    assert "checker: checker exited 1 (stderr: ImportError" in page.inner_text("#failure")
    assert errors == []
