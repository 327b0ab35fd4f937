"""A server in a child process for the length of a `with` block: started, waited for until its health URL
answers, stopped at the end. Tests and benchmarks start engine servers (`python -m clawjax.engine`) and
SGLang's router this way.

  with running([sys.executable, "-m", "clawjax.engine", "--model", "test-tiny", "--port", str(port)],
               f"http://127.0.0.1:{port}/health") as proc:
    ...
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence


def free_port() -> int:
  """A loopback port nobody listens on (at the time of asking)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@contextlib.contextmanager
def running(argv: Sequence[str], health_url: str, *, env: Mapping[str, str] | None = None,
            timeout_s: float = 240.0, cores: set[int] | None = None) -> Iterator[subprocess.Popen]:
  """Runs `argv` (with `env` added to this process's environment, pinned to `cores` if given) until the
  block ends; enters once `health_url` answers. RuntimeError if the process exits or `timeout_s` passes
  first. The process may be killed inside the block (a test of a replica going down)."""
  proc = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  try:
    if cores:
      # From here rather than a preexec_fn (Python between fork and exec in a parent that may run JAX's
      # threads), before the server starts threads of its own.
      os.sched_setaffinity(proc.pid, cores)
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        urllib.request.urlopen(health_url, timeout=2).read()
        break
      except OSError:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"{' '.join(argv[:3])}: {health_url} did not answer "
                             f"({'exit ' + str(proc.returncode) if proc.poll() is not None else 'timed out'})") from None
        time.sleep(0.5)
    yield proc
  finally:
    stop(proc)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
  """SIGTERM, then SIGKILL if `proc` has not exited after `grace_s`."""
  if proc.poll() is None:
    proc.terminate()
    try:
      proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
