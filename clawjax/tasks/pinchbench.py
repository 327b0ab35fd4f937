"""PinchBench tasks: one Markdown file per task (`tasks/*.md` of a pinchbench/skill checkout).

YAML front matter between `---` lines: `id`, `name`, `category`, `grading_type` (automated | llm_judge
| hybrid), `timeout_seconds`, `workspace_files`, optional `grading_weights` {automated, llm_judge}
(default 0.5 / 0.5). Body: `## Prompt` (the exact message to the agent), `## Automated Checks` (a
Python block defining `grade(transcript, workspace_path) -> dict`), and for judged tasks
`## LLM Judge Rubric` (`### Criterion N: NAME (Weight: W%)` headings with `**Score X**: ...` anchors).

A `workspace_files` entry is {path, content} (inline), {source, dest} (a file under the checkout's
`assets/`), or a bare file name (from the directory named after the task file).
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

from clawjax.tasks.fields import Fail, relative_path
from clawjax.tasks.records import DEFAULT_MOUNT_DIR, Checker, Rubric, RubricRule, Task, TaskError, TaskFile

GRADE_FILE = "grade.py"
_SECTION_RE = re.compile(r"^##\s+(.+?)\s*$", re.M)
_CRITERION_RE = re.compile(
    r"^###\s+(?:Criterion\s+\d+\s*:\s*)?(.+?)\s*(?:\(Weight:\s*([\d.]+)\s*%\))?\s*$", re.M)
_ANCHOR_RE = re.compile(r"\*\*Score\s+([\d.]+)\*\*\s*:?\s*(.+)")


def _front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
  lines = text.split("\n")
  if not lines or lines[0].strip() != "---":
    raise TaskError(where, "no YAML front matter (the file must start with a '---' line)")
  try:
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
  except StopIteration:
    raise TaskError(where, "front matter has no closing '---' line") from None
  try:
    import yaml  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise TaskError(where, "reading PinchBench front matter needs PyYAML (pip install pyyaml)") from None
  try:
    meta = yaml.safe_load("\n".join(lines[1:end])) or {}
  except yaml.YAMLError as e:
    raise TaskError(where, f"front matter is not valid YAML ({e})") from None
  if not isinstance(meta, dict):
    raise TaskError(where, "front matter is not a mapping")
  return meta, "\n".join(lines[end + 1:])


def _sections(body: str) -> dict[str, str]:
  heads = list(_SECTION_RE.finditer(body))
  return {m.group(1).strip().lower(): body[m.end():heads[i + 1].start() if i + 1 < len(heads) else None]
          for i, m in enumerate(heads)}


def _python_block(section: str) -> str:
  m = re.search(r"```(?:python|py)?\s*\n(.*?)```", section, re.S)
  return (m.group(1) if m else section).strip() + "\n"


def parse_rubric_markdown(text: str) -> Rubric | None:
  """Criteria with weights and score anchors from a PinchBench `## LLM Judge Rubric` section."""
  heads = list(_CRITERION_RE.finditer(text))
  rules, anchors = [], set()
  for i, m in enumerate(heads):
    chunk = text[m.end():heads[i + 1].start() if i + 1 < len(heads) else None]
    scores = {a.group(1): a.group(2).strip() for a in _ANCHOR_RE.finditer(chunk)}
    anchors.update(float(a) for a in scores)
    weight = float(m.group(2)) if m.group(2) else 1.0
    rules.append(RubricRule(name=m.group(1).strip(), file_path=None, scores=scores, weight=weight))
  if not rules:
    return None
  options = tuple(sorted(anchors)) if anchors else (0.0, 0.25, 0.5, 0.75, 1.0)
  return Rubric(score_options=options, rules=tuple(rules), text=text.strip())


def _workspace_files(entries: Any, md: pathlib.Path, fail: Fail) -> tuple[TaskFile, ...]:
  if entries is None:
    return ()
  if not isinstance(entries, list):
    raise fail("workspace_files", f"expected a list, got {type(entries).__name__}")
  out = []
  for i, e in enumerate(entries):
    field = f"workspace_files[{i}]"
    if isinstance(e, str):
      e = {"source": e, "dest": e}
    if not isinstance(e, dict):
      raise fail(field, f"expected a file name or an object, got {type(e).__name__}")
    dest = relative_path(e.get("dest") or e.get("path") or e.get("source"), fail, f"{field}.dest")
    if isinstance(e.get("content"), str):
      out.append(TaskFile(path=dest, content=e["content"].encode("utf-8")))
      continue
    source = relative_path(e.get("source"), fail, f"{field}.source")
    candidates = [md.parent.parent / "assets" / source, md.parent / md.stem / source, md.parent / source]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
      raise fail(f"{field}.source", f"{source!r} not found in {[str(c.parent) for c in candidates]}")
    out.append(TaskFile(path=dest, source=found))
  return tuple(out)


def load_markdown_task(path: str | pathlib.Path) -> Task:
  md = pathlib.Path(path)
  where = str(md)
  meta, body = _front_matter(md.read_text(encoding="utf-8"), where)
  task_id = meta.get("id")
  if not isinstance(task_id, str) or not task_id:
    raise TaskError(where, "missing or not a string", field="id")

  def fail(field: str | None, message: str) -> TaskError:
    return TaskError(where, message, task_id=task_id, field=field)

  grading_type = meta.get("grading_type", "automated")
  if grading_type not in ("automated", "llm_judge", "hybrid"):
    raise fail("grading_type", f"{grading_type!r} is not automated, llm_judge or hybrid")
  sections = _sections(body)
  prompt = sections.get("prompt", "").strip()
  if not prompt:
    raise fail("## Prompt", "missing or empty")
  checker = None
  if grading_type != "llm_judge":
    code = _python_block(sections.get("automated checks", ""))
    if not re.search(r"^def grade\s*\(", code, re.M):
      raise fail("## Automated Checks", "no Python block defining grade(transcript, workspace_path)")
    checker = Checker(kind="grade", files=(TaskFile(path=GRADE_FILE, content=code.encode("utf-8")),),
                      entry=GRADE_FILE)
  rubric = None
  if grading_type != "automated":
    rubric_text = sections.get("llm judge rubric", "")
    rubric = parse_rubric_markdown(rubric_text)
    if rubric is None:
      raise fail("## LLM Judge Rubric", "missing, or has no '### Criterion' headings")
  weights = meta.get("grading_weights") or {}
  if not isinstance(weights, dict):
    raise fail("grading_weights", "expected a mapping {automated, llm_judge}")
  w_code, w_judge = float(weights.get("automated", 0.5)), float(weights.get("llm_judge", 0.5))
  if w_code < 0 or w_judge < 0 or w_code + w_judge <= 0:
    raise fail("grading_weights", f"invalid weights {weights!r}")
  timeout = meta.get("timeout_seconds")
  if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
    raise fail("timeout_seconds", f"expected a positive number, got {timeout!r}")
  return Task(task_id=task_id, prompt=prompt, category=str(meta.get("category", "")),
              grading_type=grading_type, mount_dir=DEFAULT_MOUNT_DIR,
              input_files=_workspace_files(meta.get("workspace_files"), md, fail), checker=checker,
              rubric=rubric, source=where, code_weight=w_code / (w_code + w_judge),
              timeout_s=float(timeout) if timeout is not None else None,
              metadata={"name": meta.get("name")})
