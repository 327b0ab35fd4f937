"""Whether the call-log directory can take more records: the shim refuses work it could not record.

At start-up the directory must be writable (a probe file is created, written, fsynced and removed);
before each call and each new rollout the filesystem must be writable and have `min_free_bytes` free
(one statvfs, a few microseconds). Below that the shim answers 503, which harnesses retry, and serves
again as soon as space returns.
"""

from __future__ import annotations

import os
import tempfile


class LogSpace:

  def __init__(self, log_dir: str, min_free_bytes: int):
    self.log_dir, self.min_free_bytes = log_dir, min_free_bytes

  def check_writable(self) -> None:
    """Creates the directory if needed; raises OSError naming it when a file cannot be written there."""
    try:
      os.makedirs(self.log_dir, exist_ok=True)
      with tempfile.NamedTemporaryFile(dir=self.log_dir, prefix=".clawjax-probe-") as probe:
        probe.write(b"\n")
        probe.flush()
        os.fsync(probe.fileno())
    except OSError as e:
      raise OSError(e.errno, f"call log directory {self.log_dir} is not writable: {e.strerror}") from e

  def problem(self) -> str | None:
    """Why the directory cannot take records now, or None."""
    try:
      st = os.statvfs(self.log_dir)
    except OSError as e:
      return f"call log directory {self.log_dir}: {e.strerror}"
    if st.f_flag & os.ST_RDONLY:
      return f"call log directory {self.log_dir} is on a read-only filesystem"
    free = st.f_bavail * st.f_frsize
    if free < self.min_free_bytes:
      return (f"call log directory {self.log_dir} has {free} bytes free, below the floor of "
              f"{self.min_free_bytes} (ShimConfig.min_free_log_bytes)")
    return None
