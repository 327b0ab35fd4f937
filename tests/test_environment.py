"""environment.json: what a run ran on, each field checked against an independent source (git, the
package metadata, the lock files' bytes, JAX itself)."""
import hashlib
import importlib.metadata
import json
import pathlib
import platform
import subprocess

import jax

from clawjax import environment
from clawjax.harness import install
from clawjax.serving import vllm_cpu

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _git(cwd, *args) -> str:
  return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_describe_records_the_checkout_versions_locks_and_devices():
  env = environment.describe()
  assert env["schema"] == "clawjax.environment/1"
  assert env["clawjax"]["commit"] == _git(ROOT, "rev-parse", "HEAD")
  assert env["clawjax"]["dirty"] == bool(_git(ROOT, "status", "--porcelain", "--untracked-files=no"))
  assert env["python"]["version"] == platform.python_version()
  assert env["packages"] == {name: importlib.metadata.version(name) for name in
                             ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")}
  for name, pkg in install.PACKAGES.items():
    lock = ROOT / "third_party" / pkg.slug / "package-lock.json"
    assert env["harnesses"][name] == {"package": pkg.name, "version": pkg.version,
                                      "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}
  engine = env["engines"]["vllm-cpu"]
  assert engine["version"] == vllm_cpu.VLLM_CPU_VERSION
  assert engine["lock_sha256"] == hashlib.sha256((ROOT / "third_party/vllm-cpu/requirements.txt").read_bytes()
                                                 ).hexdigest()
  assert engine["installed"] == (vllm_cpu.python() is not None)
  devices = jax.devices()
  assert env["jax"] == {"backend": jax.default_backend(), "device_kind": devices[0].device_kind,
                        "device_count": len(devices), "local_device_count": jax.local_device_count(),
                        "process_count": jax.process_count(), "process_index": jax.process_index()}
  json.dumps(env)  # JSON-ready as it is


def test_write_environment_writes_it_whole_into_the_workdir(tmp_path):
  path = environment.write_environment(tmp_path / "run")
  assert path == tmp_path / "run" / "environment.json"
  written = json.loads(path.read_text())
  assert written["workdir"] == str((tmp_path / "run").resolve())
  assert written["clawjax"]["commit"] == _git(ROOT, "rev-parse", "HEAD")
  assert sorted(p.name for p in path.parent.iterdir()) == ["environment.json"]


def test_commit_and_dirty_flag_of_a_checkout_and_none_without_one(tmp_path, monkeypatch):
  repo = tmp_path / "repo"
  repo.mkdir()
  _git(repo, "init", "-q")
  (repo / "code.py").write_text("x = 1\n")
  _git(repo, "add", "code.py")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
  assert environment.checkout(repo) == {"path": str(repo.resolve()), "commit": _git(repo, "rev-parse", "HEAD"),
                                        "dirty": False}
  (repo / "output.json").write_text("{}")  # untracked: a run's output does not make the code dirty
  assert environment.checkout(repo)["dirty"] is False
  (repo / "code.py").write_text("x = 2\n")
  assert environment.checkout(repo)["dirty"] is True
  # A directory inside another repository is not a checkout of its own (an installed copy in a venv).
  (repo / "sub").mkdir()
  assert environment.checkout(repo / "sub")["commit"] is None
  monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))
  assert environment.checkout(repo) == {"path": str(repo.resolve()), "commit": None, "dirty": None}
  assert environment.describe()["clawjax"]["commit"] is None
