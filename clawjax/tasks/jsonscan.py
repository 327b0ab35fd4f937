"""Finding the last JSON object in free text (checker output, judge answers with prose around it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_DECODER = json.JSONDecoder()


def json_objects(text: str) -> list[tuple[Any, int, int]]:
  """Top-level JSON objects embedded in `text`, in order, as (value, start, end).

  Scans left to right; at each `{` tries to decode one object and, on success, continues after it, so
  nested objects are not reported separately and junk braces (prose, code, an unclosed `{`) are
  skipped. Quadratic in the number of braces at worst, fine for checker and judge outputs.
  """
  out = []
  i = text.find("{")
  while i != -1:
    try:
      value, end = _DECODER.raw_decode(text, i)
    except ValueError:
      i = text.find("{", i + 1)
      continue
    if isinstance(value, dict):
      out.append((value, i, end))
    i = text.find("{", end)
  return out


def last_json_object(text: str,
                     accept: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any] | None:
  """The last top-level JSON object in `text` for which `accept` holds, or None."""
  for value, _, _ in reversed(json_objects(text)):
    if accept(value):
      return value
  return None
