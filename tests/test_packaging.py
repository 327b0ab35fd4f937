"""`pip install .` gives a working package: every third-party module clawjax imports at module level is
an install requirement of setup.py, and one imported only inside a function is a requirement or an
extra's (so a missing extra fails where the feature is used, with its own message)."""
from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _requirements() -> tuple[set[str], set[str]]:
  """(install_requires, all extras) of setup.py as normalised distribution names."""
  call = next(n for n in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
              if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "setup")
  kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
  name = lambda req: re.split(r"[<>=!;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")
  extras = {name(r) for reqs in kw["extras_require"].values() for r in reqs}
  return {name(r) for r in kw["install_requires"]}, extras


def _third_party_imports() -> dict[str, bool]:
  """top-level module -> whether some clawjax module imports it at module level."""
  out: dict[str, bool] = {}
  for path in (ROOT / "clawjax").rglob("*.py"):
    tree = ast.parse(path.read_text())
    top_level = {id(n) for n in tree.body} | {id(c) for n in tree.body if isinstance(n, ast.If) for c in n.body}
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names = [node.module]
      else:
        continue
      for name in names:
        top = name.split(".")[0]
        if top not in sys.stdlib_module_names and top not in ("clawjax", "__future__"):
          out[top] = out.get(top, False) or id(node) in top_level
  return out


def test_direct_imports_are_declared():
  required, extras = _requirements()
  dists = importlib.metadata.packages_distributions()
  problems = []
  for module, at_module_level in sorted(_third_party_imports().items()):
    names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
    if at_module_level and not names & required:
      problems.append(f"{module} ({names}) is imported at module level but not in install_requires")
    elif not names & (required | extras):
      problems.append(f"{module} ({names}) is imported but declared nowhere")
  assert problems == []


def test_tensorboard_is_an_extra_not_a_requirement():
  required, extras = _requirements()
  assert "tensorboardx" in extras and "tensorboardx" not in required
  assert _third_party_imports()["tensorboardX"] is False  # only where summaries are written
