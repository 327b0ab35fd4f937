r"""Writes the bundled SFT data (clawjax/data/sft/): a synthetic tool-call task family in mini's shape.

  python scripts/make_sft_data.py [OUT_DIR]        # default: clawjax/data/sft
  python scripts/make_sft_data.py OUT_DIR --wide --train 120 --heldout 20 --train-tasks
      # the SmolLM2 experiment's data (configs/smollm2): 20 words x 20 files, and the training pairs'
      # tasks too (OUT_DIR/train_tasks, for RL on the pairs the cold start saw)

The family: 'Into the file "FILE", write the word "WORD".' over ten files and ten words. Each
trajectory is the conversation the `mini` harness has with a model that solves the task: mini's own
system prompt and tool schemas (clawjax/harness/mini), the task, one `write` tool call, the tool's real
output (the tool run on a scratch workspace), and a final answer. A seeded choice of 30 pairs, covering
every word and file, goes to train.jsonl; 6 other pairs to heldout.jsonl and, as tasks in the ClawGym
directory layout with a real checker, to tasks/ (clawjax.tasks loads them; the checker scores 1 when
FILE holds WORD). Deterministic: rerunning rewrites the same files.
"""

import argparse
import itertools
import json
import pathlib
import random
import tempfile
from collections.abc import Sequence

from clawjax.harness.mini.agent import SYSTEM_PROMPT
from clawjax.harness.mini.tools import Toolbox

# Words and file stems that are one token each in SmolLM2's and Qwen3's vocabularies.
WORDS = ("apple", "river", "stone", "cloud", "forest", "green", "water", "house", "music", "bread")
FILES = ("notes.txt", "plan.txt", "log.txt", "draft.txt", "list.txt", "story.txt", "report.txt", "names.txt",
         "summary.txt", "tasks.txt")
N_TRAIN = 30
N_HELDOUT = 6
# --wide adds these: 400 pairs, enough for ~100-300 trajectories and held-out tasks none of them has.
WIDE_WORDS = ("paper", "light", "smile", "chair", "train", "table", "grass", "money", "dream", "ocean")
WIDE_FILES = ("ideas.txt", "todo.txt", "memo.txt", "diary.txt", "answer.txt", "result.txt", "output.txt",
              "index.txt", "journal.txt", "letter.txt")
FINAL = "Done."
# The file and the word are quoted, and in the order, as the tool call's JSON writes them: the same tokens.
PROMPT = 'Into the file "{file}", write the word "{word}".'
CHECKER = '''"""Sub-scores for {task_id}: {file} holds the word {word}."""
import json
import pathlib
import sys

answer = pathlib.Path(sys.argv[1]) / "{file}"
text = answer.read_text(encoding="utf-8", errors="replace") if answer.is_file() else ""
print(json.dumps({{"right_word": float(text.strip() == "{word}")}}))
'''
REWARD_SH = '''#!/usr/bin/env bash
# Entry point, run from the workspace after the agent exited: the last stdout line is the reward,
# the plain mean of the sub-scores check.py prints.
set -euo pipefail
python3 reward/check.py "$PWD" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(sum(float(v) for v in d.values()) / len(d))'
'''


def split_pairs(words: Sequence[str] = WORDS, files: Sequence[str] = FILES, n_train: int = N_TRAIN,
                n_heldout: int = N_HELDOUT) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
  """(train, held-out) pairs: a seeded shuffle, redrawn until the train pairs use every word and file."""
  rng = random.Random(0)
  pairs = list(itertools.product(words, files))
  if n_train + n_heldout > len(pairs):
    raise SystemExit(f"--train {n_train} + --heldout {n_heldout} exceed the family's {len(pairs)} pairs")
  while True:
    rng.shuffle(pairs)
    train = pairs[:n_train]
    if {w for w, _ in train} == set(words) and {f for _, f in train} == set(files):
      return sorted(train), sorted(pairs[n_train:n_train + n_heldout])


def trajectory(word: str, file: str, k: int, tools: Toolbox) -> dict:
  call_id = f"call_{k:04x}"
  args = {"path": file, "content": word}
  return {"messages": [
      {"role": "system", "content": SYSTEM_PROMPT},
      {"role": "user", "content": PROMPT.format(word=word, file=file)},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": call_id, "type": "function", "function": {"name": "write", "arguments": json.dumps(args)}}]},
      {"role": "tool", "tool_call_id": call_id, "content": tools.run("write", args)},
      {"role": "assistant", "content": FINAL}],
      "tools": tools.schemas()}


def write_task(root: pathlib.Path, word: str, file: str) -> None:
  task_id = f"write_{word}_{file.split('.')[0]}"
  task = root / task_id
  (task / "reward").mkdir(parents=True, exist_ok=True)
  (task / "data_entry.json").write_text(json.dumps({
      "task_id": task_id, "user_query": PROMPT.format(word=word, file=file),
      "input_mount_dir": "/root/.openclaw/workspace",
      "metadata": {"category": "sft_write_word", "grading_type": "automated"}}, indent=4) + "\n")
  (task / "reward" / "check.py").write_text(CHECKER.format(task_id=task_id, word=word, file=file))
  (task / "reward" / "reward.sh").write_text(REWARD_SH)


def main(out: pathlib.Path, wide: bool, n_train: int, n_heldout: int, train_tasks: bool) -> None:
  words, files = (WORDS + WIDE_WORDS, FILES + WIDE_FILES) if wide else (WORDS, FILES)
  train, heldout = split_pairs(words, files, n_train, n_heldout)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as scratch:
    tools = Toolbox(pathlib.Path(scratch), bash_timeout_s=10.0, max_output_chars=16000)
    for name, pairs in (("train.jsonl", train), ("heldout.jsonl", heldout)):
      lines = [json.dumps(trajectory(w, f, k, tools)) for k, (w, f) in enumerate(pairs)]
      (out / name).write_text("\n".join(lines) + "\n")
  for word, file in heldout:
    write_task(out / "tasks", word, file)
  for word, file in train if train_tasks else ():
    write_task(out / "train_tasks", word, file)


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("out", nargs="?", type=pathlib.Path,
                      default=pathlib.Path(__file__).parents[1] / "clawjax" / "data" / "sft")
  parser.add_argument("--wide", action="store_true", help="20 words x 20 files instead of 10 x 10")
  parser.add_argument("--train", type=int, default=N_TRAIN, help="training trajectories")
  parser.add_argument("--heldout", type=int, default=N_HELDOUT, help="held-out trajectories and tasks")
  parser.add_argument("--train-tasks", action="store_true", help="also write the training pairs' tasks")
  args = parser.parse_args()
  main(args.out, args.wide, args.train, args.heldout, args.train_tasks)
