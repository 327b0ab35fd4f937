"""Tokenising a Claude Code-sized prompt (~20K tokens): the text layer's share of a shim call.

Three measurements on the same conversation (the system prompt, 12 tools and tool results of
`shim_overhead.py`'s Claude Code-like rollout): `encode` of the rendered prompt text in one piece,
`render` (the template's markup, content encoded as plain text) and a `PromptBuilder` call whose only
new block is a fresh tool result (~200 tokens), as the shim makes on every call. Best and median of
--reps runs, in milliseconds. Qwen3's tokenizer encodes with tiktoken, SmolLM2's (--tokenizer smollm2,
under chatml) with HF's. Compare two checkouts by running each with its own PYTHONPATH.

  python benchmarks/text_encode.py [--reps 50] [--tokenizer qwen3|smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks import shim_overhead  # pylint: disable=g-import-not-at-top,wrong-import-position
from clawjax.environment import describe as describe_environment  # pylint: disable=g-import-not-at-top,wrong-import-position
from clawjax.text import Message, PromptBuilder, ToolSpec, load_template  # pylint: disable=g-import-not-at-top,wrong-import-position


def conversation(n_results: int) -> tuple[list[Message], list[ToolSpec]]:
  request = shim_overhead.first_request()
  tools = [ToolSpec(t["name"], t["description"], t["input_schema"]) for t in request["tools"]]
  messages = [Message("system", request["system"][0]["text"]), Message("user", "Refactor the project."),
              Message("system", request["messages"][1]["content"])]
  for k in range(n_results):
    messages += [Message("assistant", "Let me look."), Message("user", shim_overhead.tool_result(k))]
  return messages, tools


def timed(fn: Callable[[], object], reps: int) -> dict[str, float]:
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return {"best_ms": 1e3 * min(times), "median_ms": 1e3 * statistics.median(times)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--reps", type=int, default=50)
  parser.add_argument("--tool-results", type=int, default=20, help="conversation length (20: ~20K tokens)")
  parser.add_argument("--tokenizer", choices=("qwen3", "smollm2"), default="qwen3")
  args = parser.parse_args()
  template = load_template(args.tokenizer)
  messages, tools = conversation(args.tool_results)
  text = template.render_text(messages, tools)
  builder = PromptBuilder(template)
  builder.build(messages, tools)
  fresh = iter(range(10**9))

  def next_call():  # the shim's per-call work: everything cached but one new tool result
    result = shim_overhead.tool_result(0, salt=str(next(fresh)))
    builder.build(messages + [Message("assistant", "Next."), Message("user", result)], tools)

  print(json.dumps({
      "tokenizer": args.tokenizer, "chars": len(text), "tokens": len(template.tokenizer.encode(text)),
      "encode": timed(lambda: template.tokenizer.encode(text), args.reps),
      "render": timed(lambda: template.render(messages, tools), args.reps),
      "builder_call": timed(next_call, args.reps),
      "environment": describe_environment(),
  }))


if __name__ == "__main__":
  main()
