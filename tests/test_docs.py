"""The manual points at things that exist: in README.md and docs/*.md every relative link (and its #anchor)
resolves, every configs/*.py cited exists, every script and `python -m clawjax.X` cited exists, and every
`--config.a.b=...` of a command is a field of the config that command's script takes."""
from __future__ import annotations

import pathlib
import re

import pytest

from clawjax import config as config_lib
from clawjax.evaluation.config import EvalConfig
from clawjax.sft.config import SFTRunConfig
from clawjax.train.config import TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The config each experiment script takes (compile: the train config, or the SFT one for an SFT file).
SCRIPT_CONFIGS = {"train": TrainConfig, "sft": SFTRunConfig, "eval": EvalConfig, "compile": TrainConfig}
COMMAND = re.compile(r"python3? (-m (?P<module>clawjax[\w.]*)|(?P<script>[\w./-]+\.py))(?P<args>[^`\n]*)")
CONFIG_KEY = re.compile(r"--config\.([\w.]+)")
# `--config.a.b=v` and the like stand for any field in prose: a segment in capitals, or these words.
PLACEHOLDER_SEGMENTS = {"a", "b", "section", "field"}


def _ids(paths):
  return [p.relative_to(ROOT).as_posix() for p in paths]


def _code(text: str) -> list[str]:
  """The file's code, one command a string: inline `spans` and code lines, `\\` continuations joined."""
  text = re.sub(r"\\\n\s*", " ", text)
  spans = [" ".join(m.group(1).split()) for m in re.finditer(r"`([^`]+)`", text)]
  return spans + [line for line in text.splitlines() if line.startswith("    ")]


def _commands(path: pathlib.Path) -> list[re.Match]:
  return [m for code in _code(path.read_text()) for m in COMMAND.finditer(code.split(" # ")[0])]


def _slug(heading: str) -> str:
  """GitHub's anchor of a Markdown heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve(path):
  for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
    if re.match(r"[a-z]+:", target):
      continue
    file, _, anchor = target.partition("#")
    resolved = (path.parent / file).resolve() if file else path
    assert resolved.exists(), f"{path.name}: link {target!r} points at nothing"
    if anchor:
      headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
      assert anchor in {_slug(h) for h in headings}, f"{path.name}: no heading #{anchor} in {file}"


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_cited_config_files_scripts_and_modules_exist(path):
  text = path.read_text()
  for config in re.findall(r"(?<![\w/])(configs/[\w./-]+\.py)", text):
    assert (ROOT / config).is_file(), f"{path.name}: {config} does not exist"
  for command in _commands(path):
    if command["module"]:
      module = ROOT / command["module"].replace(".", "/")
      assert module.with_suffix(".py").is_file() or (module / "__main__.py").is_file(), \
          f"{path.name}: python -m {command['module']}: no such module to run"
    else:
      assert (ROOT / command["script"]).is_file(), f"{path.name}: python {command['script']}: no such script"


@pytest.mark.parametrize("path", DOCS, ids=_ids(DOCS))
def test_config_keys_of_commands_are_fields_of_their_script_config(path):
  checked = 0
  for command in _commands(path):
    script = pathlib.Path(command["script"] or "").stem
    if script not in SCRIPT_CONFIGS:
      continue
    cls = SCRIPT_CONFIGS[script]
    if script == "compile" and "--config=configs/sft/" in command["args"]:
      cls = SFTRunConfig
    for key in CONFIG_KEY.findall(command["args"]):
      try:
        config_lib.field_hint(cls, key)
      except config_lib.ConfigError as e:
        pytest.fail(f"{path.name}: {command.group(0).strip()[:80]}...: {e}")
      checked += 1
  # (and the prose's own `--config.a.b` mentions: fields of some run's config)
  for key in CONFIG_KEY.findall(path.read_text()):
    if any(s.isupper() or s in PLACEHOLDER_SEGMENTS for s in key.split(".")):
      continue
    errors = []
    for cls in (TrainConfig, SFTRunConfig, EvalConfig):
      try:
        config_lib.field_hint(cls, key.rstrip("."))
        break
      except config_lib.ConfigError as e:
        errors.append(str(e))
    else:
      pytest.fail(f"{path.name}: --config.{key} is a field of no run's config ({errors[0]})")


def test_the_manual_cites_commands_of_every_script():
  scripts = {pathlib.Path(c["script"]).stem for p in DOCS for c in _commands(p) if c["script"]}
  assert {"train", "sft", "eval", "compile", "tables", "plot", "report"} <= scripts
