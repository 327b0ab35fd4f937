"""RFT from a run's call logs: a toy evaluation (the real shim, the real `mini` harness, the bundled toy
tasks' real checkers; a scripted policy stands for the model, solving some tasks and half-solving
others) is read back by the SFT stage, and only rollouts scored >= min_score are trained, each tree
exactly the calls the shim logged for it; the rest are counted."""
from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from clawjax.calllog import load
from clawjax.evaluation.config import eval_config
from clawjax.evaluation.runner import run_eval
from clawjax.serving.backends.scripted import ScriptedBackend, ScriptTurn
from clawjax.sft.config import sft_config
from clawjax.sft.data import DataError
from clawjax.sft.dataset import load_trees
from clawjax.tasks import bundled_tasks_dir
from clawjax.text.templates import load_template

TASKS = bundled_tasks_dir()


def _tool(name, **arguments):
  return ScriptTurn(text="", tool_calls=((name, arguments),))


def _solver(template):
  """A tool call chosen from the task's words, then a final answer: three tasks solved, two half."""
  numbers = (TASKS / "toy_sum_numbers" / "input_files" / "numbers.txt").read_text().split()
  moves = {"numbers.txt": _tool("write", path="answer.txt", content=str(sum(map(int, numbers)))),
           "server.log": _tool("bash", command="grep -c ERROR server.log > errors.txt"),
           "recieve": _tool("edit", path="notes.md", old_text="recieve", new_text="receive"),
           "todo.txt": _tool("bash", command="cp todo.txt done.txt"),  # the old name stays: 2 of 3
           "hello.py": _tool("write", path="hello.py", content="print('Hello, world!')\n")}  # 2 of 3

  def play(input_ids):
    prompt = template.tokenizer.decode(list(input_ids))
    if "<tool_response>" in prompt:
      return ScriptTurn(text="Done.")
    return next(turn for word, turn in moves.items() if word in prompt)
  return play


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("rft")
  template = load_template("qwen3")
  config = eval_config({"tasks": str(TASKS), "harness": "mini", "benchmark": "toy", "model_label": "scripted",
                        "concurrency": 2, "progress": False, "model": {"init": "qwen3"},
                        "engine": {"backend": "scripted"},
                        "rollout": {"timeout_s": 60.0, "settle_interval_s": 0.05, "settle_checks": 2,
                                    "work_root": str(tmp / "work")}})
  run_eval(config, tmp / "run", backend=ScriptedBackend(template, _solver(template)))
  results = [json.loads(l) for l in (tmp / "run" / "results.jsonl").read_text().splitlines()]
  assert sorted(r["final_score"] for r in results) == pytest.approx([2 / 3, 2 / 3, 1, 1, 1])
  return tmp / "run", results, template


@pytest.mark.slow
@pytest.mark.parametrize("min_score", [1.0, 0.5])
def test_only_rollouts_scored_at_least_min_score_are_trained(eval_run, min_score):
  run, results, template = eval_run
  cfg = sft_config({"data": {"calls": [str(run)]}, "min_score": min_score, "model": {"init": "test-tiny"},
                    "tensorboard": False})
  counts = collections.Counter()
  trees = load_trees(cfg.data, template, cfg, counts)
  wanted = {r["rollout_id"] for r in results if r["final_score"] >= min_score}
  assert {t.rollout_id.rsplit(":", 1)[1] for t in trees} == wanted
  below = sum(r["final_score"] < min_score for r in results)
  assert counts == collections.Counter({"rollouts": 5, "rollouts_trained": len(wanted), "whole": len(wanted),
                                        **({"rollouts_below_min_score": below} if below else {})})
  calls = load(run / "calls").calls
  for t in trees:
    logged = calls[t.rollout_id.rsplit(":", 1)[1]]
    last = logged[-1]  # mini's tool loop is one path: the last call holds the whole rollout
    assert t.tokens_T.tolist() == list(last.input_ids + last.output_ids)
    trained = np.zeros(t.size, bool)
    for c in logged:
      trained[len(c.input_ids):len(c.input_ids) + len(c.output_ids)] = True
    np.testing.assert_array_equal(t.owner_T >= 0, trained)


@pytest.mark.slow
def test_a_run_directory_without_records_is_an_error(eval_run, tmp_path):
  run, _, template = eval_run
  cfg = sft_config({"data": {"calls": [str(run / "calls")]}, "model": {"init": "test-tiny"}, "tensorboard": False})
  with pytest.raises(DataError, match="not a train or eval run directory"):
    load_trees(cfg.data, template, cfg, collections.Counter())
