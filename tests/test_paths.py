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


def test_a_changed_lock_is_another_install_and_its_interrupted_reinstall_claims_nothing(tmp_path):
  old, new = paths.lock_stamp("pkg==1", b"lock v1"), paths.lock_stamp("pkg==1", b"lock v2")
  assert old != new and old.startswith("pkg==1 lock-sha256=")
  with paths.install_once(tmp_path, old) as needed:
    assert needed
  with pytest.raises(RuntimeError):
    with paths.install_once(tmp_path, new) as needed:
      assert needed  # the new lock reinstalls...
      raise RuntimeError("interrupted")
  # ...and once it has begun, the prefix is neither the old install nor the new one.
  assert not paths.installed(tmp_path, old) and not paths.installed(tmp_path, new)


def test_a_missing_lock_says_where_locks_come_from(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"missing: clawjax installs .* from the locks in third_party/"):
    paths.read_lock(tmp_path / "package-lock.json")
  assert (paths.THIRD_PARTY / "README.md").exists()
