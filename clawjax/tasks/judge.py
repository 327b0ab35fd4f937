"""The rubric judge for hybrid tasks, through any OpenAI-compatible chat endpoint.

The judge model sees the user task, the final output files (those the rubric names), the other files
the agent changed (the workspace diffed against the task's inputs), optionally the transcript, and the
rubric; it must end its answer with one JSON object {"scores": {criterion: anchor}, "notes": ...}.
The LAST such object in the answer counts, so prose, thinking and markdown fences around it are fine.
Every criterion must get a value among the rubric's `score_options`; otherwise the answer is
unparsable: recorded, retried up to `retries` more times, then the rubric scores 0. Aggregation is
done here, not by the judge: the weighted mean over criteria (equal weights unless the rubric gives
them).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import pathlib
import re
from typing import Any

import aiohttp

from clawjax.config import Count, Fraction, NonNegative, Positive
from clawjax.tasks.jsonscan import last_json_object
from clawjax.tasks.records import Rubric, Task
from clawjax.tasks.workspace import diff_workspace


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
  url: str  # OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (POST {url}/chat/completions)
  model: str
  api_key: str = ""
  retries: NonNegative[int] = 2  # further attempts after an unparsable answer or an HTTP failure
  timeout_s: Positive[float] = 300.0  # per request
  temperature: NonNegative[float] = 0.0  # the paper does not publish judge sampling settings
  max_tokens: Count = 4096
  code_weight: Fraction = 0.7  # final = code_weight * code + rubric_weight * rubric (paper: 0.7 / 0.3)
  rubric_weight: Fraction = 0.3
  max_file_chars: Count = 20_000  # per file shown to the judge; longer files are truncated, with a note
  include_transcript: bool = False
  max_transcript_chars: Count = 40_000


@dataclasses.dataclass
class JudgeResult:
  score: float  # weighted mean over criteria; 0 when no parsable answer came back
  scores: dict[str, float]
  notes: str | None
  error: str | None  # the last failure when every attempt failed
  attempts: list[str]  # one line per failed attempt (HTTP error, unparsable answer)
  raw: str  # the last answer text

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


class JudgeParseError(ValueError):
  pass


# ---------------------------------------------------------------------------------------------------
# Prompt


def _file_block(workspace: pathlib.Path, rel: str, max_chars: int) -> str:
  p = workspace / rel
  if not p.is_file():
    return f"### {rel}\n(missing: the file does not exist in the final workspace)\n"
  data = p.read_bytes()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    return f"### {rel}\n(binary file, {len(data)} bytes)\n"
  note = ""
  if len(text) > max_chars:
    text, note = text[:max_chars], f"\n[... truncated: {len(data)} bytes in total]"
  return f"### {rel}\n```\n{text}\n```{note}\n"


def _rubric_text(rubric: Rubric) -> str:
  if rubric.text:
    return rubric.text
  lines = []
  for r in rubric.rules:
    target = f" (file: {r.file_path})" if r.file_path else ""
    lines.append(f"- criterion {json.dumps(r.name)}{target}")
    for anchor, desc in sorted(r.scores.items(), key=lambda kv: _as_float(kv[0], 0.0)):
      lines.append(f"    - {anchor}: {desc}")
  return "\n".join(lines)


def _as_float(s: str, default: float) -> float:
  try:
    return float(s)
  except ValueError:
    return default


def build_messages(task: Task, workspace: str | os.PathLike[str], config: JudgeConfig,
                   transcript: list[Any] | None = None) -> list[dict[str, str]]:
  assert task.rubric is not None
  ws = pathlib.Path(workspace)
  rubric = task.rubric
  outputs = sorted({r.file_path.lstrip("/") for r in rubric.rules if r.file_path})
  diff = diff_workspace(task, ws)
  others = [p for p in diff.changed if p not in outputs]
  options = ", ".join(f"{o:g}" for o in rubric.score_options)
  names = ", ".join(json.dumps(r.name) for r in rubric.rules)
  parts = [
      "## User task\n" + task.prompt.strip(),
      "## Final output files\n" + ("\n".join(_file_block(ws, p, config.max_file_chars) for p in outputs)
                                   or "(the rubric names no output file)"),
      "## Other files the agent created or changed\n"
      + ("\n".join(_file_block(ws, p, config.max_file_chars) for p in others) or "(none)")
      + ("\n\nDeleted input files: " + ", ".join(diff.deleted) if diff.deleted else ""),
  ]
  if config.include_transcript and transcript:
    parts.append("## Transcript\n```json\n"
                 + json.dumps(transcript, ensure_ascii=False)[:config.max_transcript_chars] + "\n```")
  parts.append("## Rubric\n" + _rubric_text(rubric))
  parts.append(
      "## Your answer\nScore each criterion on exactly one of these values: " + options + ". "
      "Explain briefly if you like, then end your answer with one JSON object of the form "
      '{"scores": {"<criterion>": <value>, ...}, "notes": "<one or two sentences>"} '
      f"with one entry for every criterion: {names}.")
  system = ("You are a strict grader. You judge the final state of an agent's workspace against a "
            "rubric. Judge only what is in the files shown; do not reward intentions.")
  return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


# ---------------------------------------------------------------------------------------------------
# Parsing


def _key(s: str) -> str:
  return re.sub(r"\s+", " ", s.strip().lower())


def parse_judgement(text: str, rubric: Rubric) -> tuple[dict[str, float], str | None]:
  """(score per criterion, notes) from the judge's answer; raises JudgeParseError."""
  obj = last_json_object(text, lambda d: isinstance(d.get("scores"), dict))
  if obj is None:
    raise JudgeParseError("no JSON object with a 'scores' object in the answer")
  given = {_key(str(k)): v for k, v in obj["scores"].items()}
  scores = {}
  for rule in rubric.rules:
    if _key(rule.name) not in given:
      raise JudgeParseError(f"criterion {rule.name!r} has no score")
    raw = given[_key(rule.name)]
    v = _as_float(raw, float("nan")) if isinstance(raw, str) else raw
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
      raise JudgeParseError(f"criterion {rule.name!r}: {raw!r} is not a number")
    anchor = next((o for o in rubric.score_options if abs(o - v) < 1e-6), None)
    if anchor is None:
      raise JudgeParseError(f"criterion {rule.name!r}: {v!r} is not one of the anchors "
                            f"{list(rubric.score_options)}")
    scores[rule.name] = anchor
  notes = obj.get("notes")
  return scores, (notes if isinstance(notes, str) else None if notes is None else json.dumps(notes))


def aggregate(scores: dict[str, float], rubric: Rubric) -> float:
  total = sum(r.weight for r in rubric.rules)
  if total <= 0:
    return sum(scores.values()) / len(scores)
  return sum(r.weight * scores[r.name] for r in rubric.rules) / total


# ---------------------------------------------------------------------------------------------------
# Client


async def _complete(session: aiohttp.ClientSession, config: JudgeConfig,
                    messages: list[dict[str, str]]) -> str:
  headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
  body = {"model": config.model, "messages": messages, "temperature": config.temperature,
          "max_tokens": config.max_tokens, "stream": False}
  async with session.post(config.url.rstrip("/") + "/chat/completions", json=body, headers=headers,
                          timeout=aiohttp.ClientTimeout(total=config.timeout_s)) as resp:
    text = await resp.text()
    if resp.status != 200:
      raise aiohttp.ClientResponseError(resp.request_info, resp.history, status=resp.status,
                                        message=text[:300])
  try:
    content = json.loads(text)["choices"][0]["message"]["content"]
  except (ValueError, KeyError, IndexError, TypeError) as e:
    raise JudgeParseError(f"not a chat completion response ({type(e).__name__}: {e})") from None
  if isinstance(content, list):  # content parts
    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
  if not isinstance(content, str):
    raise JudgeParseError(f"message content is {type(content).__name__}, not text")
  return content


async def judge_workspace(task: Task, workspace: str | os.PathLike[str], config: JudgeConfig, *,
                          transcript: list[Any] | None = None,
                          session: aiohttp.ClientSession | None = None) -> JudgeResult:
  """Judges the workspace against the task's rubric; never raises for a bad endpoint or answer."""
  if task.rubric is None:
    raise ValueError(f"task {task.task_id!r} has no rubric")
  messages = build_messages(task, workspace, config, transcript)
  own = session is None
  session = session or aiohttp.ClientSession()
  attempts: list[str] = []
  raw = ""
  try:
    for i in range(1 + config.retries):
      try:
        raw = await _complete(session, config, messages)
        scores, notes = parse_judgement(raw, task.rubric)
        return JudgeResult(score=aggregate(scores, task.rubric), scores=scores, notes=notes,
                           error=None, attempts=attempts, raw=raw)
      except (aiohttp.ClientError, asyncio.TimeoutError, JudgeParseError) as e:
        attempts.append(f"attempt {i + 1}: {type(e).__name__}: {e}")
  finally:
    if own:
      await session.close()
  return JudgeResult(score=0.0, scores={}, notes=None, error=attempts[-1], attempts=attempts, raw=raw)
