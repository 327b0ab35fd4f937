"""The quickstart's cold-start demonstrator (configs/quickstart.py: `sft.demonstrator`).

A scripted policy (it stands for the model in the demonstrations, never for a component): the first
call of a rollout answers with a `write` tool call of one of the words the task lists, the call after
the tool result with `final_text`. Each task's listed words are written in turn, equally often, so SFT
teaches the tool-call format and that each task has its own words, but leaves the choice among them to
RL.
"""

from __future__ import annotations

import collections
import re
import threading

from clawjax.serving.backends.scripted import ScriptTurn
from clawjax.text.templates import RESPONSE_OPEN, ChatTemplate

# Matches the quickstart prompts: "... (grey, blue, pink or white) into sky.txt."
PROMPT_PATTERN = r"\((?P<choices>[^()]*)\) into (?P<path>\S+\.txt)"


class ChoiceDemonstrator:
  """prompt ids -> the turn to play. `prompt_pattern` has groups "path" (the file to write) and
  "choices" (the words, split at commas and "or")."""

  def __init__(self, template: ChatTemplate, prompt_pattern: str = PROMPT_PATTERN, final_text: str = "Done."):
    self.template, self.final_text = template, final_text
    self.pattern = re.compile(prompt_pattern)
    if not {"path", "choices"} <= set(self.pattern.groupindex):
      raise ValueError(f"prompt_pattern {prompt_pattern!r}: needs groups 'path' and 'choices'")
    self._next: collections.Counter[str] = collections.Counter()
    self._lock = threading.Lock()

  def __call__(self, input_ids: list[int]) -> ScriptTurn:
    text = self.template.tokenizer.decode(input_ids)
    if RESPONSE_OPEN in text:
      return ScriptTurn(self.final_text)
    found = list(self.pattern.finditer(text))
    if not found:
      raise ValueError(f"prompt_pattern {self.pattern.pattern!r} matches nothing in the prompt")
    path = found[-1]["path"]
    choices = [w for w in re.split(r",\s*|\s+or\s+", found[-1]["choices"]) if w]
    with self._lock:
      k = self._next[path]
      self._next[path] += 1
    return ScriptTurn("", None, (("write", {"path": path, "content": choices[k % len(choices)]}),))
