"""Typed access to a decoded JSON request body; every failure names the field path (messages.2.content)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clawjax.serving.errors import invalid

_MISSING = object()
_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "an integer", float: "a number"}


def type_name(v: Any) -> str:
  return "null" if v is None else _TYPE_NAMES.get(type(v), type(v).__name__)


# What each requested type accepts, by exact type (JSON decoding yields no subclasses): a bool is never
# an int or a number, an int is a number.
_ACCEPTS = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def check(v: Any, path: str, *types: type) -> Any:
  """Returns v if it is one of `types`, else raises invalid(path)."""
  tv = type(v)
  for t in types:
    if tv in _ACCEPTS[t]:
      return v
  want = " or ".join(_TYPE_NAMES[t] for t in types)
  raise invalid(path, f"expected {want}, got {type_name(v)}")


def get(d: dict[str, Any], key: str, path: str, *types: type, default: Any = _MISSING) -> Any:
  """d[key] checked against `types`; missing (or null, when a default is given) -> default or error.
  The field path is only formatted on error: this runs for every block of every request."""
  v = d.get(key, _MISSING)
  if v is _MISSING or (v is None and default is not _MISSING):
    if default is _MISSING:
      raise invalid(f"{path}.{key}" if path else key, "field required")
    return default
  tv = type(v)
  for t in types:
    if tv in _ACCEPTS[t]:
      return v
  return check(v, f"{path}.{key}" if path else key, *types)


def positive_int(d: dict[str, Any], key: str, path: str = "") -> int | None:
  v = get(d, key, path, int, default=None)
  if v is not None and v < 1:
    raise invalid(f"{path}.{key}" if path else key, f"must be >= 1, got {v}")
  return v


def text_of(content: Any, path: str, kinds: tuple[str, ...] = ("text",)) -> str:
  """Text of string-or-blocks message content (the APIs' shape): the `text` of the blocks whose type is
  one of `kinds`; other blocks (images, documents) are skipped."""
  if isinstance(content, str):
    return content
  return "\n".join(get(block, "text", where, str)
                   for where, block, kind in blocks(content, path) if kind in kinds)


def blocks(content: Any, path: str) -> Iterator[tuple[str, dict[str, Any], str]]:
  """(path of the block, the block, its `type`) for each block of a content list."""
  for i, block in enumerate(check(content, path, list)):
    where = f"{path}.{i}"
    block = check(block, where, dict)
    yield where, block, get(block, "type", where, str)
