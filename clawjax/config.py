"""Typed run configurations from ml_collections ConfigDicts and `--config.a.b=v` command-line overrides.

A run's configuration is a tree of frozen dataclasses (clawjax.train.config.TrainConfig,
clawjax.evaluation.config.EvalConfig); a config file (configs/*.py) returns a ConfigDict that sets some
of their fields, and every other field keeps its documented default. `resolve` builds the dataclass
from the file's values plus the command line's overrides, checking against the dataclass, not the
file: every field is settable from the command line whichever file is used.

  --config.learner.kl_coef=0.1            a number
  --config.harnesses=mini,openclaw         a tuple field: a comma list (or a Python literal)
  --config.model.overrides.d_model=64      a key inside a dict field
  --config.rollout.judge.url=none          None, for a field that may be None

An unknown key, a wrong type, a bad name or a number out of its field's range is a `ConfigError`, one
line that names the key (and the closest valid keys), raised before anything starts. A number field
declares the values it means something for on its type: `lr: Positive[float]` (> 0), `retries:
NonNegative[int]` (>= 0), `top_p: Fraction` (in [0, 1]), `steps: Count` (>= 1), or `Annotated[int,
Range(low=8)]` for another range. The experiment scripts' command line (the config file, its overrides,
`--print_config`, `--workdir`) is clawjax/cli.py.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import json
import math
import pathlib
import sys
import traceback
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

T = TypeVar("T")
_NONE_WORDS = ("none", "null")
_TRUE_WORDS = ("true", "1", "yes", "on")
_FALSE_WORDS = ("false", "0", "no", "off")


class ConfigError(ValueError):
  """A configuration mistake; the message is one line naming the field."""


# ---- ranges: the values a number field means something for -------------------------------------------


@dataclasses.dataclass(frozen=True)
class Range:
  """A number field's meaningful values, declared on its type (`Annotated[float, Range(low=0)]`) and
  checked wherever a config is built from a file or the command line: finite, and within [low, high]
  (an open end excludes its bound)."""
  low: float | None = None
  high: float | None = None
  open_low: bool = False
  open_high: bool = False

  def __str__(self) -> str:
    if self.low is not None and self.high is not None:
      return f"in {'(' if self.open_low else '['}{self.low:g}, {self.high:g}{')' if self.open_high else ']'}"
    if self.low is not None:
      return f"{'>' if self.open_low else '>='} {self.low:g}"
    return f"{'<' if self.open_high else '<='} {self.high:g}"

  def holds(self, value: float) -> bool:
    return math.isfinite(value) and (
        self.low is None or (value > self.low if self.open_low else value >= self.low)) and (
        self.high is None or (value < self.high if self.open_high else value <= self.high))


Positive = Annotated[T, Range(low=0, open_low=True)]                     # rates, timeouts, sizes
NonNegative = Annotated[T, Range(low=0)]                                 # coefficients, retries, 0 = off
Fraction = Annotated[float, Range(low=0, high=1)]                        # probabilities, weights
FractionBelow1 = Annotated[float, Range(low=0, high=1, open_high=True)]  # Adam's betas, shares of a run
Count = Annotated[int, Range(low=1)]                                     # at least one


def _range_of(hint: Any) -> Range | None:
  """The Range declared on a type hint (also inside `X | None`)."""
  for h in _union_args(hint) or (hint,):
    if typing.get_origin(h) is Annotated:
      found = next((m for m in h.__metadata__ if isinstance(m, Range)), None)
      if found is not None:
        return found
  return None


def check_range(hint: Any, value: Any, where: str) -> None:
  """A ConfigError when the field of type `hint` (with its extras) declares a Range `value` is outside of."""
  bound = _range_of(hint)
  if bound is None or not isinstance(value, (int, float)) or isinstance(value, bool) or bound.holds(value):
    return
  finite = "" if math.isfinite(value) else "a finite number "
  raise ConfigError(f"{where}: must be {finite}{bound}, got {value!r}")


# ---- the schema: a dataclass tree --------------------------------------------------------------------


def _union_args(hint: Any) -> tuple[Any, ...]:
  return typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
      else ()


def _dataclass_in(hint: Any) -> type | None:
  candidates = _union_args(hint) or (hint,)
  return next((c for c in candidates if dataclasses.is_dataclass(c)), None)


def _is_mapping(hint: Any) -> bool:
  base = _without_none(hint)
  origin = typing.get_origin(base) or base
  return origin in (dict, Mapping) or (isinstance(origin, type) and issubclass(origin, Mapping))


def _without_none(hint: Any) -> Any:
  args = [a for a in _union_args(hint) if a is not type(None)]
  return args[0] if len(args) == 1 else hint


def schema_paths(cls: type, prefix: str = "") -> dict[str, Any]:
  """Every settable dotted path of dataclass `cls` -> its type hint (nested dataclasses recursed)."""
  out: dict[str, Any] = {}
  for name, hint in typing.get_type_hints(cls).items():
    path = f"{prefix}{name}"
    out[path] = hint
    nested = _dataclass_in(hint)
    if nested is not None:
      out.update(schema_paths(nested, path + "."))
  return out


# Keys that moved, old -> new: an old key's error names its new place.
MOVED_FIELDS = {"engine.model": "model.init", "engine.template": "model.template",
                "engine.template_family": "model.template_family"}


def did_you_mean(name: str, choices: Sequence[str] | Mapping[str, str]) -> str:
  """"; did you mean a, b?" with the choices closest to `name` (a mapping's values for its closest
  keys), or "" when none is close."""
  shown = choices if isinstance(choices, Mapping) else {c: c for c in choices}
  close = [shown[c] for c in difflib.get_close_matches(name, list(shown), n=3, cutoff=0.6)]
  return f"; did you mean {', '.join(close)}?" if close else ""


def check_keys(cls: type, keys: Sequence[str], where: str) -> None:
  """A ConfigError naming the first of `keys` (of a dict field handed to dataclass `cls` as keyword
  arguments, e.g. model.overrides -> ModelConfig) that is not a field of `cls`, with the closest fields."""
  fields = [f.name for f in dataclasses.fields(cls)]
  for key in keys:
    if key not in fields:
      raise ConfigError(f"{where}.{key}: not a field of {cls.__name__}{did_you_mean(key, fields)}")


def _suggestions(path: str, root: type) -> str:
  if path in MOVED_FIELDS:
    return f"; it is {MOVED_FIELDS[path]} now"
  paths = list(schema_paths(root))
  leaf = path.rsplit(".", 1)[-1]
  close = [p for p in paths if p.rsplit(".", 1)[-1] == leaf]  # the right name at another level
  close += [p for p in difflib.get_close_matches(path, paths, n=3, cutoff=0.6) if p not in close]
  if len(close) < 3:
    leaves = {p.rsplit(".", 1)[-1]: p for p in paths}
    close += [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=3, cutoff=0.75)
              if leaves[m] not in close]
  return f"; did you mean {', '.join(close[:3])}?" if close else ""


def field_hint(root: type, path: str) -> Any:
  """The type hint at dotted `path` of dataclass `root`; inside a dict field any key is allowed (Any)."""
  cls: type | None = root
  parts = path.split(".")
  for i, name in enumerate(parts):
    hints = typing.get_type_hints(cls)
    if name not in hints:
      raise ConfigError(f"config.{path}: unknown field{_suggestions(path, root)}")
    hint = hints[name]
    if i == len(parts) - 1:
      return hint
    if _is_mapping(hint):
      return Any
    cls = _dataclass_in(hint)
    if cls is None:
      raise ConfigError(f"config.{path}: config.{'.'.join(parts[:i + 1])} has no fields")
  raise AssertionError(path)


# ---- command-line values -----------------------------------------------------------------------------


def parse_value(hint: Any, text: str, where: str) -> Any:
  """A command-line string as a value of type `hint`."""
  if text.strip().lower() in _NONE_WORDS and type(None) in _union_args(hint):
    return None
  base = _without_none(hint)
  origin = typing.get_origin(base) or base
  try:
    if base is Any:
      try:
        return ast.literal_eval(text)
      except (ValueError, SyntaxError):
        return text
    if origin is bool:
      word = text.strip().lower()
      if word not in _TRUE_WORDS + _FALSE_WORDS:
        raise ValueError(f"not one of {_TRUE_WORDS + _FALSE_WORDS}")
      return word in _TRUE_WORDS
    if origin in (int, float):
      return origin(text)
    if origin is str:
      return text
    if origin is tuple:
      (item, *_) = typing.get_args(base) or (str,)
      if text.strip()[:1] in ("(", "["):
        value = ast.literal_eval(text)
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)
      return tuple(parse_value(item, part.strip(), where) for part in text.split(",") if part.strip())
    if _is_mapping(base):
      value = ast.literal_eval(text)
      if not isinstance(value, dict):
        raise ValueError("not a dict literal")
      return value
    if _dataclass_in(base) is not None:
      raise ValueError("a section; set its fields one by one (--config.section.field=value)")
  except (ValueError, SyntaxError) as e:
    raise ConfigError(f"{where}: cannot read {text!r} as {_type_name(hint)}: {e}") from None
  return text


def _type_name(hint: Any) -> str:
  base = _without_none(hint)
  name = getattr(typing.get_origin(base) or base, "__name__", str(base))
  return f"{name} or None" if type(None) in _union_args(hint) else name


def _set_path(values: dict[str, Any], path: str, value: Any) -> None:
  node = values
  *parents, leaf = path.split(".")
  for name in parents:
    child = node.get(name)
    if not isinstance(child, dict):
      child = node[name] = {}
    node = child
  node[leaf] = value


def parse_override(root: type, item: str) -> tuple[str, Any]:
  """"a.b=v" -> (path, typed value), checked against dataclass `root`."""
  path, eq, text = item.partition("=")
  if not eq or not path:
    raise ConfigError(f"--config.{item}: expected --config.FIELD=VALUE")
  return path, parse_value(field_hint(root, path), text, f"config.{path}")


# ---- building the dataclass --------------------------------------------------------------------------


def _convert(hint: Any, value: Any, where: str, default: Any, root: type) -> Any:
  nested = _dataclass_in(hint)
  if nested is not None and isinstance(value, Mapping):
    if default is None:  # an optional component: off while its required fields are unset
      required = [f.name for f in dataclasses.fields(nested) if f.default is dataclasses.MISSING
                  and f.default_factory is dataclasses.MISSING]
      unset = [k for k in required if value.get(k) in (None, "")]
      if unset == required:
        return None
      if unset:
        raise ConfigError(f"{where}: {unset} must be set too (or none of {required})")
      return from_mapping(nested, value, where, root=root)
    return from_mapping(nested, value, where, base=default, root=root)
  args = _union_args(hint)
  if value is None:
    if type(None) in args:
      return None
    raise ConfigError(f"{where}: must be set")
  base = _without_none(hint)
  origin = typing.get_origin(base) or base
  if origin is tuple and isinstance(value, (list, tuple)):
    return tuple(value)
  if origin is tuple and isinstance(value, str):  # a file's "a,b" means the same as on the command line
    return parse_value(hint, value, where)
  if origin is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if _is_mapping(base) and isinstance(value, Mapping):
    return dict(value)
  if origin in (str, int, float, bool, dict) and not isinstance(value, origin) or (
      origin is int and isinstance(value, bool)):
    raise ConfigError(f"{where}: expected {origin.__name__}, got {type(value).__name__} {value!r}")
  return value


def from_mapping(cls: type[T], values: Mapping[str, Any], where: str = "config", base: T | None = None,
                 root: type | None = None) -> T:
  """Builds dataclass `cls` (or updates `base`) from `values`, recursing into nested dataclasses. `where`
  is the path of `cls` in the whole config, `root` the whole config's class (for suggestions)."""
  root = root or cls
  fields = {f.name: f for f in dataclasses.fields(cls)}
  prefix = where.partition(".")[2]
  for name in sorted(set(values) - set(fields)):
    path = f"{prefix}.{name}" if prefix else name
    raise ConfigError(f"{where}.{name}: unknown field{_suggestions(path, root)}")
  if base is None:
    for name, f in fields.items():
      if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        raise ConfigError(f"{where}.{name}: must be set (--{where}.{name}=...)")
  hints, extras = typing.get_type_hints(cls), typing.get_type_hints(cls, include_extras=True)
  kwargs = {}
  for name, value in values.items():
    f = fields[name]
    if base is not None:
      default = getattr(base, name)
    elif f.default is not dataclasses.MISSING:
      default = f.default
    elif f.default_factory is not dataclasses.MISSING:
      default = f.default_factory()
    else:
      default = None
    kwargs[name] = _convert(hints[name], value, f"{where}.{name}", default, root)
    check_range(extras[name], kwargs[name], f"{where}.{name}")
  try:
    return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
  except ConfigError:
    raise
  except (TypeError, ValueError, KeyError) as e:
    message = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    raise ConfigError(f"{where}: {message}") from None


def resolve(cls: type[T], values: Mapping[str, Any] | Any, overrides: Sequence[str] = ()) -> T:
  """The dataclass `cls` of a ConfigDict (or nested dict) with `--config.` overrides ("a.b=v") on top."""
  values = values.to_dict() if hasattr(values, "to_dict") else json.loads(json.dumps(values, default=list))
  if not isinstance(values, dict):
    raise ConfigError(f"config: expected a ConfigDict or a dict, got {type(values).__name__}")
  for item in overrides:
    path, value = parse_override(cls, item)
    _set_path(values, path, value)
  return from_mapping(cls, values, "config", root=cls)


# ---- what a config holds -----------------------------------------------------------------------------


_SECRET_FIELDS = ("api_key", "admin_api_key", "admin_token")


def _redact(tree: Any) -> Any:
  if isinstance(tree, dict):
    return {k: "<set>" if k in _SECRET_FIELDS and v else _redact(v) for k, v in tree.items()}
  return tree


def to_json(cfg: Any) -> dict[str, Any]:
  """A config as JSON-ready nested dicts (tuples become lists), secrets (API keys) left out."""
  return _redact(json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out: dict[str, Any] = {}
  for k, v in tree.items():
    if isinstance(v, Mapping) and v:
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
  """path -> (old, new) for every leaf that differs between two JSON configs."""
  a, b = flatten(old), flatten(new)
  missing = object()
  return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
          if a.get(k, missing) != b.get(k, missing)}


def check_resume(saved: Mapping[str, Any], cfg: Any, resumable: Sequence[str], allow: bool) -> None:
  """A resumed run must run what it started with: a ConfigError listing what differs between the run's
  saved config (its config.json) and `cfg`, leaving out the fields `resumable` (and what they hold),
  unless `allow`."""
  diff = {k: v for k, v in differences(saved, to_json(cfg)).items()
          if not any(k == f or k.startswith(f + ".") for f in resumable)}
  if diff and not allow:
    listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(diff.items())[:8])
    raise ConfigError(f"config differs from the run's config.json ({listed}); resume it unchanged, use "
                      "another --workdir, or pass --config.allow_config_change=True")


def check_tensorboard(enabled: bool) -> None:
  """`tensorboard=True` needs tensorboardX: a ConfigError saying how to get it, before anything starts."""
  if not enabled:
    return
  try:
    import tensorboardX  # pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    raise ConfigError("config.tensorboard: needs tensorboardX (pip install 'clawjax[tensorboard]'), "
                      "or set --config.tensorboard=False") from None


# ---- plugins -----------------------------------------------------------------------------------------


def _import_file(path: pathlib.Path) -> types.ModuleType:
  """The module of a .py file, imported once per process (under a name made from its path)."""
  path = path.resolve()
  module_name = f"clawjax_file_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
  if module_name in sys.modules:
    return sys.modules[module_name]
  spec = importlib.util.spec_from_file_location(module_name, path)
  if spec is None or not path.is_file():
    raise FileNotFoundError(f"no such file {path}")
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[module_name]
    raise
  return module


def _line_in(error: BaseException, path: pathlib.Path) -> str:
  """"FILE:LINE: " of the deepest frame of `error` inside `path` (its own line for a SyntaxError)."""
  path = path.resolve()
  if isinstance(error, SyntaxError) and error.filename and pathlib.Path(error.filename).resolve() == path:
    return f"{error.filename}:{error.lineno}: "
  frames = [f for f in traceback.extract_tb(error.__traceback__) if pathlib.Path(f.filename).resolve() == path]
  return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def load_config_file(spec: str) -> Any:
  """The ConfigDict of `--config=FILE[:ARG]`: FILE's `get_config(ARG)` (`get_config()` without ARG). No
  such file, no get_config, an error in the file or a ValueError of get_config (a bad ARG) is a
  ConfigError naming the file (and the line for an error in its code)."""
  path_text, colon, arg = spec.partition(":")
  where, path = f"--config={spec}", pathlib.Path(path_text)
  if not path.is_file():
    siblings = {p.name: p.as_posix() for p in path.parent.glob("*.py")} if path.parent.is_dir() else {}
    raise ConfigError(f"{where}: no such file{did_you_mean(path.name, siblings)}")
  try:
    get_config = getattr(_import_file(path), "get_config", None)
    if get_config is None:
      raise ConfigError(f"{where}: {path_text} defines no get_config()")
    config = get_config(*([arg] if colon else []))
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (any failure of the file's code is the config's)
    # A ValueError is the file's own check of its argument; anything else is a mistake in its code.
    message = str(e) if isinstance(e, ValueError) else f"{_line_in(e, path)}{type(e).__name__}: {e}"
    raise ConfigError(f"{where}: {' '.join(message.split())}") from None
  if config is None:
    raise ConfigError(f"{where}: get_config() returned None (a missing return?)")
  return config


def config_module(config_file: str, sibling: str) -> types.ModuleType:
  """A config file's helper module beside it (configs/ is not a package): in configs/paper/x.py,
  `config_module(__file__, "common.py")`."""
  return _import_file(pathlib.Path(config_file).parent / sibling)


def import_plugins(names: Sequence[str], where: str = "config.plugins") -> None:
  """Imports each plugin: a dotted module name (`my_pkg.my_losses`) or a path to a .py file. Plugins
  register things by importing (losses, harness adapters); importing twice is a no-op."""
  for name in names:
    try:
      if name.endswith(".py"):
        _import_file(pathlib.Path(name))
      else:
        importlib.import_module(name)
    except Exception as e:  # pylint: disable=broad-except  (any failure of user code is the config's)
      raise ConfigError(f"{where}: cannot import {name!r}: {type(e).__name__}: {e}") from None


def import_object(spec: str, where: str) -> Any:
  """The object named by "module.path:attribute" (imported now); a ConfigError naming `where` if not."""
  module_name, colon, attr = spec.partition(":")
  if not colon or not module_name or not attr:
    raise ConfigError(f"{where}: {spec!r} is not MODULE:NAME")
  try:
    return getattr(importlib.import_module(module_name), attr)
  except Exception as e:  # pylint: disable=broad-except  (any failure of user code is the config's)
    raise ConfigError(f"{where}: cannot import {spec!r}: {type(e).__name__}: {e}") from None
