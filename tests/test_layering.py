"""The package's import structure: no import cycle between two modules or two packages, and the layers
stay apart (the learner maths imports nothing of the run's orchestration; the engine nothing of the
shim; the text layer nothing of the models; the kernels sit below the model, which alone uses them).
Every import counts, also one inside a function."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "clawjax"

# package -> packages it must not import (directly or through a module of its own).
FORBIDDEN = {
    "rl": {"serving", "harness", "engine", "tasks", "evaluation", "train", "run", "text"},
    "tree": {"serving", "harness", "engine", "tasks", "evaluation", "train", "run", "rl", "models", "text"},
    # (models may use text: converting SmolLM2's GGUF writes its tokenizer with the text layer's builder)
    "models": {"serving", "harness", "engine", "tasks", "evaluation", "train", "run", "rl", "tree"},
    "engine": {"serving", "harness", "tasks", "evaluation", "train", "run", "rl", "text"},
    "text": {"models", "engine", "serving", "harness", "tasks", "evaluation", "train", "run", "rl"},
    "serving": {"harness", "tasks", "evaluation", "train", "run", "rl"},
    "harness": {"serving", "engine", "evaluation", "train", "run", "rl", "models"},
    "tasks": {"serving", "harness", "engine", "evaluation", "train", "run", "rl", "models", "text"},
    "run": {"train", "evaluation", "rl"},
    "evaluation": {"train"},
    # (training and evaluation both write their run's report at the end)
    "report": {"train", "evaluation", "run", "serving", "harness", "engine", "rl"},
    # The SFT stage sits beside RL: the train loop uses it for its cold start, so it uses nothing of train
    # (its metrics writer is passed in) and runs no harness or engine of its own.
    "sft": {"train", "evaluation", "harness", "engine", "tasks"},
}


# The accelerator kernels (clawjax/kernels/) import nothing of clawjax but these, and only these packages
# of clawjax import them (outside the package: benchmarks, scripts and tests).
KERNELS_IMPORT = {"kernels", "config", "sharding"}
KERNELS_IMPORTED_BY = {"kernels", "models", "aot"}


def _module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, modules: set[str]) -> set[str]:
  """The clawjax modules `path` imports (a `from pkg import name` of a submodule counts as that module)."""
  name = _module_name(path)
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
      continue
    for target in targets:
      while target and target not in modules:  # `import clawjax.tree.pack as p` -> the module itself
        target = target.rpartition(".")[0]
      if target.startswith("clawjax") and target != name:
        out.add(target)
  return out


def _graph() -> dict[str, set[str]]:
  files = {_module_name(p): p for p in PACKAGE.rglob("*.py") if "data" not in p.relative_to(PACKAGE).parts}
  return {m: _imports(p, set(files)) for m, p in files.items()}


def _group(module: str) -> str:
  """The package a module belongs to: clawjax.rl.learner -> rl; clawjax.calllog -> calllog."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "clawjax"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Strongly connected components with more than one node (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_graph_sees_lazy_imports():
  graph = _graph()
  assert "clawjax.tree.pack" in graph["clawjax.rl.learner"] or "clawjax.tree.batch" in graph["clawjax.rl.learner"]
  # run/session.py imports the engine inside a function: that edge must be seen too.
  assert "clawjax.engine.engine" in graph["clawjax.run.session"]


def test_no_module_cycle():
  assert _cycles(_graph()) == []


def test_no_package_cycle():
  packages: dict[str, set[str]] = {}
  for m, deps in _graph().items():
    packages.setdefault(_group(m), set()).update(_group(d) for d in deps if _group(d) != _group(m))
  assert _cycles(packages) == []


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layers_stay_apart(package):
  edges = sorted((m, d) for m, deps in _graph().items() if _group(m) == package
                 for d in deps if _group(d) in FORBIDDEN[package])
  assert edges == []


def test_kernels_sit_below_the_model():
  graph = _graph()
  assert any(_group(d) == "kernels" for m, deps in graph.items() if _group(m) == "models" for d in deps)
  upward = sorted((m, d) for m, deps in graph.items() if _group(m) == "kernels"
                  for d in deps if _group(d) not in KERNELS_IMPORT)
  assert upward == []
  users = sorted((m, d) for m, deps in graph.items() if _group(m) not in KERNELS_IMPORTED_BY
                 for d in deps if _group(d) == "kernels")
  assert users == []
