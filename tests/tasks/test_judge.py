"""The rubric judge against a local OpenAI-compatible server standing in for the judge model."""
import asyncio
import json
import pathlib
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawjax.tasks import JudgeConfig, load_jsonl, load_task_dir, load_tasks, make_workspace, score
from clawjax.tasks.judge import JudgeParseError, judge_workspace, parse_judgement
from clawjax.tasks.jsonscan import last_json_object

from tests.tasks.conftest import FIXTURES

REPO = pathlib.Path(__file__).resolve().parents[2]
HYBRID = FIXTURES / "dir" / "task_0002_hybrid"


def _answer(scores, notes="fine"):
  return json.dumps({"scores": scores, "notes": notes})


def _config(judge, **kw):
  return JudgeConfig(url=judge.url, model="judge-model", api_key="sk-test", **kw)


def test_parse_takes_the_last_scores_object_among_junk():
  rubric = load_task_dir(HYBRID).rubric
  text = ("<think>Maybe {\"scores\": {\"tone\": 0}} no... an unclosed { brace</think>\n"
          "Here is my verdict:\n```json\n" + _answer({"tone": 1, "completeness": "0.75"}) +
          "\n```\n{\"unrelated\": true} Thanks!")
  scores, notes = parse_judgement(text, rubric)
  assert scores == {"tone": 1.0, "completeness": 0.75} and notes == "fine"


@pytest.mark.parametrize("text, why", [
    ("no json at all", "no JSON object"),
    (_answer({"tone": 1}), "'completeness' has no score"),
    (_answer({"tone": 1, "completeness": 0.6}), "not one of the anchors"),
    (_answer({"tone": "high", "completeness": 1}), "not a number"),
])
def test_parse_rejects(text, why):
  with pytest.raises(JudgeParseError, match=why):
    parse_judgement(text, load_task_dir(HYBRID).rubric)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c,
                                                                               max_size=3),
                           max_leaves=8)


@settings(max_examples=30, deadline=None)
@given(first=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
       last=st.dictionaries(st.text(max_size=6), json_values, max_size=4),
       junk=st.lists(st.text(alphabet=st.characters(blacklist_characters="{}\"\\"), max_size=20),
                     min_size=3, max_size=3))
def test_last_json_object_property(first, last, junk):
  text = junk[0] + json.dumps(first) + junk[1] + "{" + json.dumps(last, indent=1) + junk[2]
  assert last_json_object(text) == last


def test_judge_prompt_and_score(tmp_path, judge):
  task = load_task_dir(HYBRID)
  ws = make_workspace(task, tmp_path)
  (ws / "announcement.md").write_text("Offsite on 2026-12-10 at Lakeside Lodge, bring shoes!")
  (ws / "scratch.txt").write_text("draft notes")
  (ws / "event.txt").unlink()
  judge.replies = ["Looks good.\n" + _answer({"tone": 0.75, "completeness": 1})]
  result = score(task, ws, judge=_config(judge))
  assert result.code_score == 1.0 and result.rubric_score == pytest.approx(0.875)
  assert result.final_score == pytest.approx(0.7 * 1.0 + 0.3 * 0.875)
  assert result.rubric_notes == "fine" and result.error is None
  [(headers, body)] = judge.requests
  assert headers["Authorization"] == "Bearer sk-test" and body["model"] == "judge-model"
  prompt = body["messages"][-1]["content"]
  for needle in (task.prompt, "Lakeside Lodge", "### scratch.txt", "draft notes",
                 "Deleted input files: event.txt", "Warm, clear and inviting.", '"completeness"'):
    assert needle in prompt, needle
  # The output file is shown once, as an output, not again among the other changed files.
  assert prompt.count("### announcement.md") == 1


def test_unparsable_answers_are_retried_then_scored_zero(tmp_path, judge):
  task = load_task_dir(HYBRID)
  ws = make_workspace(task, tmp_path)
  judge.replies = ["I refuse to answer in JSON.", 500, _answer({"tone": 0.5, "completeness": 0.5})]
  verdict = asyncio.run(judge_workspace(task, ws, _config(judge, retries=2)))
  assert verdict.score == 0.5 and len(verdict.attempts) == 2 and verdict.error is None
  assert "JudgeParseError" in verdict.attempts[0] and "500" in verdict.attempts[1]
  judge.replies = ["still no json"]
  judge.requests.clear()
  result = score(task, ws, judge=_config(judge, retries=1))
  assert len(judge.requests) == 2 and result.rubric_score == 0.0
  assert "no JSON object" in result.details["rubric"]["error"] and "judge:" in result.error
  assert result.final_score == pytest.approx(0.7 * result.code_score)


def test_task_weights_and_weighted_criteria(tmp_path, judge):
  [task] = load_tasks(FIXTURES / "pinchbench")  # grading_weights 0.6 / 0.4; criteria 75% / 25%
  ws = make_workspace(task, tmp_path)
  judge.replies = [_answer({"Clarity": 1.0, "formatting": 0.0})]  # names match case-insensitively
  result = score(task, ws, judge=_config(judge))
  assert result.rubric_score == pytest.approx(0.75)
  assert result.final_score == pytest.approx(0.6 * result.code_score + 0.4 * 0.75)


def test_cli_with_judge(tmp_path, judge):
  task = next(t for t in load_jsonl(FIXTURES / "tasks.jsonl")
              if getattr(t, "task_id", "") == "jsonl_hybrid_reply")
  ws = make_workspace(task, tmp_path)
  (ws / "reply.md").write_text("Sorry about order A-1042; a replacement ships today.")
  judge.replies = [_answer({"politeness": 1, "resolution": 0.75})]
  out = subprocess.run(
      [sys.executable, "-m", "clawjax.tasks", "score", "--task", f"{FIXTURES / 'tasks.jsonl'}:3",
       "--workspace", str(ws), "--judge-url", judge.url, "--judge-model", "m"],
      cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
  got = json.loads(out.stdout)
  assert got["code_score"] == 1.0 and got["rubric_score"] == pytest.approx(0.875)
  assert got["final_score"] == pytest.approx(0.7 + 0.3 * 0.875)
