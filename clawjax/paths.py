"""Where clawjax keeps what it builds on first use (converted weights, installed harnesses)."""

import os
import pathlib


def cache_dir(*parts: str) -> pathlib.Path:
  """$CLAWJAX_CACHE (default ~/.cache/clawjax) joined with `parts`, created if missing."""
  root = pathlib.Path(os.environ.get("CLAWJAX_CACHE", pathlib.Path.home() / ".cache" / "clawjax"))
  path = root.joinpath(*parts)
  path.mkdir(parents=True, exist_ok=True)
  return path
