"""The sandbox: isolation under bubblewrap (files, network, process lifetime), the honest fallback, and
mode="bwrap" refusing to run without it."""

import dataclasses
import gc
import http.server
import logging
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from clawjax.harness import sandbox
from clawjax.harness.rollout import RolloutConfig, run_rollout
from clawjax.serving.backends.scripted import ScriptTurn

needs_bwrap = pytest.mark.skipif(sandbox.bwrap_problem() is not None,
                                 reason=f"bubblewrap unusable: {sandbox.bwrap_problem()}")


@pytest.fixture
def dirs(tmp_path):
  ws, home = tmp_path / "ws", tmp_path / "home"
  ws.mkdir()
  home.mkdir()
  return tmp_path, ws, home


@pytest.fixture
def http_server():
  srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
  srv.RequestHandlerClass.log_message = lambda *a: None
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  yield srv.server_address[1]
  srv.shutdown()


def _run(dirs, code, config=sandbox.SandboxConfig(), **kw):
  tmp, ws, home = dirs
  spec = sandbox.SandboxSpec(argv=[sys.executable, "-c", textwrap.dedent(code)], workspace=ws,
                             home=home, env={"PATH": "/usr/bin:/bin"}, timeout_s=kw.pop("timeout_s", 60),
                             stdout_path=tmp / "out", stderr_path=tmp / "err", **kw)
  result = sandbox.run(spec, config)
  return result, (tmp / "out").read_text(), (tmp / "err").read_text()


@needs_bwrap
def test_bwrap_files_and_network_isolation(dirs, http_server):
  tmp, ws, home = dirs
  secret = tmp / "checker.py"  # next to the workspace on the host, like a task's reward files
  secret.write_text("SECRET")
  other = socket.socket()
  other.bind(("127.0.0.1", 0))
  other.listen()
  other_port = other.getsockname()[1]
  code = f"""
    import os, socket, urllib.request, pathlib
    def connects(port):
      s = socket.socket(); s.settimeout(3)
      try:
        s.connect(("127.0.0.1", port)); return True
      except OSError:
        return False
    print("shim", urllib.request.urlopen("http://127.0.0.1:{http_server}/", timeout=10).status)
    print("other", connects({other_port}))
    pathlib.Path("made.txt").write_text("x")
    pathlib.Path(os.environ["HOME"], "h.txt").write_text("x")
    for p in ["/usr/evil", "{tmp}/evil"]:
      try:
        open(p, "w"); print("wrote", p)
      except OSError:
        print("refused", p)
    print("secret", os.path.exists("{secret}"),
          "tests", os.path.exists("{pathlib.Path(__file__).parent}"))
    print("cwd", os.getcwd())
  """
  result, out, err = _run(dirs, code, loopback_ports=[http_server], workspace_mount="/mnt/ws")
  other.close()
  assert result.returncode == 0, err
  assert (result.sandbox, result.network, result.fallback_reason) == ("bwrap", "loopback-relay", None)
  lines = out.split("\n")
  assert "shim 200" in lines
  assert "other False" in lines  # a loopback port that was not relayed is unreachable
  assert "refused /usr/evil" in lines
  assert not (tmp / "evil").exists()  # /tmp inside is a throwaway tmpfs, not the host's
  assert "secret False tests False" in lines
  assert "cwd /mnt/ws" in lines
  assert (ws / "made.txt").exists() and (home / "h.txt").exists()
  # Outside addresses: a fresh network namespace has no route at all.
  result, out, _ = _run(dirs, """
    import socket
    s = socket.socket(); s.settimeout(3)
    try:
      s.connect(("1.1.1.1", 80)); print("outside reachable")
    except OSError as e:
      print("outside", e.errno)
  """)
  assert "outside reachable" not in out


@needs_bwrap
def test_relay_ends_quietly_with_a_connection_still_open(dirs, caplog):
  # The shim keeps a harness's connections alive after the harness exits; the relay then closes them
  # as it ends, without the traceback asyncio prints for a cancelled connection handler (inside), and
  # without leaving a handler pending when its loop closes (outside: asyncio logs it when collected).
  holder = socket.socket()
  holder.bind(("127.0.0.1", 0))
  holder.listen()
  held = []
  threading.Thread(target=lambda: held.append(holder.accept()), daemon=True).start()
  port = holder.getsockname()[1]
  result, out, err = _run(dirs, f"""
    import socket, time
    s = socket.create_connection(("127.0.0.1", {port}), timeout=10)
    s.sendall(b"hello")
    time.sleep(0.5)
    print("sent")
  """, loopback_ports=[port])
  holder.close()
  assert result.returncode == 0 and out.strip() == "sent", err
  assert held and held[0][0].recv(5) == b"hello"  # the relay carried the connection
  assert err == "", err
  gc.collect()
  assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_timeout_kills_process_group(dirs, mode):
  code = """
    import subprocess, time
    kids = [subprocess.Popen(["sleep", "317"]) for _ in range(2)]
    time.sleep(300)
  """
  t0 = time.monotonic()
  result, _, _ = _run(dirs, code, sandbox.SandboxConfig(mode=mode, kill_grace_s=0.5), timeout_s=3)
  assert result.timed_out and result.returncode is None
  assert time.monotonic() - t0 < 30
  # The grandchildren die too (the kernel reaps a PID namespace asynchronously: poll briefly).
  deadline = time.monotonic() + 10
  while _alive("sleep 317") and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not _alive("sleep 317")


def _alive(cmdline: str) -> bool:
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode()
      with open(f"/proc/{pid}/stat") as f:
        state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
      continue
    if cmdline in cmd and state != "Z":
      return True
  return False


def test_plain_subprocess_fallback_is_reported(dirs, http_server):
  result, out, err = _run(dirs, f"""
    import os, urllib.request
    print(urllib.request.urlopen("http://127.0.0.1:{http_server}/", timeout=10).status, os.getcwd(),
          os.environ["HOME"], "LEAK" in os.environ)
  """, sandbox.SandboxConfig(mode="none"), loopback_ports=[http_server])
  tmp, ws, home = dirs
  assert result.returncode == 0, err
  assert (result.sandbox, result.network) == ("none", "host")
  assert out.split() == ["200", str(ws), str(home), "False"]


def test_auto_mode_falls_back_loudly_when_bwrap_cannot_run(dirs, monkeypatch, caplog):
  monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap not found on PATH")
  with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
    result, out, _ = _run(dirs, "import os; print(os.getcwd())")
  assert (result.sandbox, result.network) == ("none", "host")
  assert result.fallback_reason == "bwrap not found on PATH"
  assert result.isolation() == sandbox.isolation(sandbox.SandboxConfig()) == {
      "sandbox_mode": "auto", "sandbox": "none", "network": "host", "sandbox_fallback": "bwrap not found on PATH"}
  assert "falling back to a plain subprocess" in caplog.text
  assert out.strip() == str(dirs[1])


def test_the_fallback_is_logged_once_not_once_a_rollout(dirs, monkeypatch, caplog):
  """(A run without bubblewrap logged it for 816 of its 1,023 lines.) Every result still says it."""
  reason = f"bwrap not found on PATH ({dirs[0].name})"
  monkeypatch.setattr(sandbox, "bwrap_problem", lambda: reason)
  with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
    results = [_run(dirs, "print(1)")[0] for _ in range(3)]
  assert [r.fallback_reason for r in results] == [reason] * 3
  assert [r.getMessage() for r in caplog.records].count(
      f"harness sandbox: falling back to a plain subprocess (no isolation): {reason}") == 1


@pytest.mark.parametrize("problem", ["bwrap not found on PATH (Debian: apt-get install -y bubblewrap)",
                                     "bwrap cannot create namespaces here: Operation not permitted"])
def test_bwrap_mode_refuses_to_run_without_it_and_names_the_install(dirs, monkeypatch, problem):
  monkeypatch.setattr(sandbox, "bwrap_problem", lambda: problem)
  config = sandbox.SandboxConfig(mode="bwrap")
  for attempt in (lambda: sandbox.isolation(config), lambda: _run(dirs, "open('ran', 'w')", config)):
    with pytest.raises(sandbox.SandboxError) as e:
      attempt()
    assert problem in str(e.value) and "`apt-get install -y bubblewrap`" in str(e.value)
  assert not (dirs[1] / "ran").exists()


@needs_bwrap
def test_isolation_says_what_each_mode_runs_under():
  assert sandbox.isolation(sandbox.SandboxConfig(mode="bwrap")) == {
      "sandbox_mode": "bwrap", "sandbox": "bwrap", "network": "loopback-relay", "sandbox_fallback": None}
  assert sandbox.isolation(sandbox.SandboxConfig(isolate_network=False))["network"] == "host"
  assert sandbox.isolation(sandbox.SandboxConfig(mode="none")) == {
      "sandbox_mode": "none", "sandbox": "none", "network": "host", "sandbox_fallback": None}


def test_a_rollout_record_says_it_ran_without_isolation(make_shim, hello_task, tmp_path, monkeypatch):
  monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap not found on PATH")
  shim = make_shim([ScriptTurn(text="Done.")])
  config = RolloutConfig(timeout_s=60, settle_interval_s=0.05, settle_checks=2, work_root=str(tmp_path / "w"))
  extra = run_rollout(shim.url, hello_task, "mini", config, admin_token=shim.admin_token).record.extra
  assert {k: extra[k] for k in ("sandbox_mode", "sandbox", "network", "sandbox_fallback")} == {
      "sandbox_mode": "auto", "sandbox": "none", "network": "host", "sandbox_fallback": "bwrap not found on PATH"}
  failed = run_rollout(shim.url, hello_task, "mini", dataclasses.replace(
      config, sandbox=sandbox.SandboxConfig(mode="bwrap")), admin_token=shim.admin_token).record
  assert failed.status == "failed" and failed.extra["sandbox_mode"] == "bwrap"
  assert "apt-get install -y bubblewrap" in failed.extra["reason"]


@needs_bwrap
def test_read_only_paths_under_tmp_stay_visible(dirs):
  """The sandbox's fresh /tmp must not cover what it binds from under /tmp (a checkout or venv there)."""
  tmp, _, _ = dirs
  install = tmp / "install"  # tmp_path lies under the host's /tmp
  install.mkdir()
  (install / "tool.txt").write_text("TOOL")
  result, out, err = _run(dirs, f"""
    import pathlib
    print(pathlib.Path({str(install / "tool.txt")!r}).read_text())
    """, ro_paths=[install])
  assert str(install).startswith("/tmp/")
  assert result.returncode == 0 and out.strip() == "TOOL", err


# Run in a second process whose clawjax is a copy on PYTHONPATH: what Python inside the sandbox imports.
_WHICH_CLAWJAX = """
import pathlib, sys, clawjax
from clawjax.harness import sandbox
tmp = pathlib.Path(sys.argv[1])
spec = sandbox.SandboxSpec(argv=[sys.executable, "-P", "-c", "import clawjax; print(clawjax.__file__)"],
                           workspace=tmp / "ws", home=tmp / "home", env={"PATH": "/usr/bin:/bin"}, timeout_s=60,
                           stdout_path=tmp / "out", stderr_path=tmp / "err", loopback_ports=[int(sys.argv[3])])
result = sandbox.run(spec, sandbox.SandboxConfig(mode=sys.argv[2]))
print(clawjax.__file__, result.returncode, (tmp / "out").read_text().strip(), (tmp / "err").read_text()[-300:])
"""


@pytest.mark.parametrize("mode", [pytest.param("bwrap", marks=needs_bwrap), "none"])
def test_python_inside_imports_the_clawjax_this_process_imports(dirs, http_server, mode):
  """A checkout run through PYTHONPATH while the venv's own install of clawjax names another checkout (an
  editable install), or none: the relay and the harness's Python inside import this process's clawjax
  (the other one is not mounted under bwrap: "No module named 'clawjax'" in every rollout)."""
  tmp, _, _ = dirs
  here = pathlib.Path(sandbox.__file__).parents[1]
  shutil.copytree(here, tmp / "checkout" / "clawjax", ignore=lambda d, names: [n for n in names if n in ("__pycache__", "data")])
  env = {**os.environ, "PYTHONPATH": str(tmp / "checkout")}
  out = subprocess.run([sys.executable, "-c", _WHICH_CLAWJAX, str(tmp), mode, str(http_server)], env=env, cwd=tmp,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  imported, returncode, inside, err = (out.stdout.split(" ", 3) + ["", "", ""])[:4]
  assert imported == str(tmp / "checkout" / "clawjax" / "__init__.py")
  assert (returncode, inside) == ("0", imported), err
