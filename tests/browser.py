"""A real headless browser for the HTML pages (the rollout-tree viewer, the run report): Debian's chromium
driven by playwright with that executable (scripts/test.sh installs both). A test skips, saying which is
missing, where either is not installed."""

from __future__ import annotations

import contextlib
import pathlib
import shutil
from collections.abc import Iterator

import pytest

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def chromium() -> str | None:
  return next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and pathlib.Path(p).exists()), None)


@contextlib.contextmanager
def open_page(path: pathlib.Path, fragment: str = "") -> Iterator[tuple[object, list[str]]]:
  """(page, errors): `path` opened from disk with the network off; `errors` collects console errors,
  uncaught exceptions and any request that leaves the file (a self-contained page makes none)."""
  try:
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
  except ImportError:
    pytest.skip("playwright is not installed (pip install '.[test]'; scripts/test.sh does)")
  exe = chromium()
  if exe is None:
    pytest.skip("chromium is not installed (apt-get install chromium; scripts/test.sh does as root)")
  errors: list[str] = []
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_FLAGS)
    try:
      page = browser.new_page(viewport={"width": 1400, "height": 900})
      page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
      page.on("pageerror", lambda e: errors.append(f"exception: {e}"))
      page.on("request", lambda r: errors.append(f"request: {r.url}") if not r.url.startswith("file:") else None)
      page.goto(path.resolve().as_uri() + fragment)
      yield page, errors
    finally:
      browser.close()
