"""The npm installers: a clear error when npm or its registry is unreachable, and idempotence."""

import time

import pytest

from clawjax.harness import install

from tests.ports import free_port

LEFT_PAD = install.NpmPackage("left-pad", "1.3.0", "left-pad")


def test_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
  port = free_port()
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{port}/")
  monkeypatch.setenv("npm_config_fetch_retries", "0")
  monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # nothing cached to fall back on
  with pytest.raises(install.NpmUnreachable, match="left-pad@1.3.0"):
    install.npm_install(LEFT_PAD)
  assert not (LEFT_PAD.prefix() / ".clawjax-installed").exists()


def test_missing_npm_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(install.NpmUnreachable, match="npm is not on PATH"):
    install.npm_install(LEFT_PAD)


@pytest.mark.harness
@pytest.mark.slow
def test_second_install_does_not_touch_npm(monkeypatch, tmp_path):
  try:
    exe = install.install_claude_code()
  except install.NpmUnreachable as e:
    pytest.skip(f"npm unreachable: {e}")
  monkeypatch.setenv("PATH", str(tmp_path))  # no npm at all now
  t0 = time.monotonic()
  assert install.install_claude_code() == exe and exe.exists()
  assert time.monotonic() - t0 < 5
