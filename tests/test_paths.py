"""The cache's install-once protocol: a finished install is never redone, a failed one always is."""
import pytest

from clawjax import paths


def test_install_once_redoes_a_failed_install_and_keeps_a_finished_one(tmp_path):
  runs = []

  def attempt(fail: bool) -> None:
    with paths.install_once(tmp_path, "pkg==1") as needed:
      if needed:
        runs.append(fail)
        if fail:
          raise RuntimeError("interrupted")

  with pytest.raises(RuntimeError):
    attempt(fail=True)
  assert not paths.installed(tmp_path, "pkg==1")
  attempt(fail=False)
  attempt(fail=False)  # Already there: the block is told so and does nothing.
  assert runs == [True, False]
  assert paths.installed(tmp_path, "pkg==1") and not paths.installed(tmp_path, "pkg==2")
