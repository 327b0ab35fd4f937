"""A full disk under the call log: every call the shim acknowledged (a 200, a stream that ended
normally) is on disk and readable, no line is ever torn, refused calls get the dialect's error shape,
and once space returns the shim serves again without a restart.

The log dir is a 256 KiB tmpfs mounted for the test (root can mount). Where mounting is not allowed, a
write hook stands in for the tiny filesystem: writes to the log dir past its capacity are cut short and
then fail with ENOSPC, and statvfs reports what is left (the test's id says which one ran).
"""
import contextlib
import errno
import json
import os
import random
import subprocess

import anthropic
import openai
import pytest

from clawjax import calllog
from clawjax.harness.rollout import ShimClient, ShimError
from clawjax.serving import logspace

from tests.serving.helpers import FINAL_TURN, anthropic_text, log_calls, openai_text, post, responses_text

CAPACITY = 256 * 1024
FLOOR = 32 * 1024  # ShimConfig.min_free_log_bytes in this test


def _mount_tmpfs(path) -> bool:
  os.makedirs(path)
  proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={CAPACITY}", "tmpfs", str(path)],
                        capture_output=True, check=False)
  return proc.returncode == 0


class _TinyDisk:
  """The write hook: a filesystem of CAPACITY bytes holding the files under `root` (sizes from fstat)."""

  def __init__(self, root, monkeypatch):
    self.root = os.fspath(root)
    os.makedirs(self.root)
    real_writev, real_write, real_statvfs = os.writev, os.write, os.statvfs

    def free() -> int:
      return CAPACITY - sum(os.path.getsize(os.path.join(self.root, n)) for n in os.listdir(self.root))

    def ours(fd) -> bool:
      return os.readlink(f"/proc/self/fd/{fd}").startswith(self.root + "/")

    def writev(fd, buffers):
      data = b"".join(buffers)
      return write(fd, data) if ours(fd) else real_writev(fd, buffers)

    def write(fd, data):
      if not ours(fd):
        return real_write(fd, data)
      room = free()
      if room <= 0:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return real_write(fd, bytes(data[:room]))

    def statvfs(path):
      st = real_statvfs(path)
      if not os.path.abspath(path).startswith(self.root):
        return st
      fields = list(st)
      fields[0] = fields[1] = 1  # f_bsize, f_frsize
      fields[4] = max(free(), 0)  # f_bavail
      return os.statvfs_result(fields)

    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(logspace.os, "statvfs", statvfs)


@pytest.fixture(params=["tmpfs", "write-hook"])
def tiny_log_dir(request, tmp_path, monkeypatch):
  log_dir = tmp_path / "logs"
  if request.param == "tmpfs":
    if not _mount_tmpfs(log_dir):
      pytest.skip("cannot mount a tmpfs here (not root?): the write-hook variant covers it")
    try:
      yield log_dir
    finally:
      subprocess.run(["umount", "-l", str(log_dir)], check=False)
  else:
    _TinyDisk(log_dir, monkeypatch)
    yield log_dir


def _free(log_dir) -> int:
  st = logspace.os.statvfs(log_dir)
  return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def _leave_free(log_dir, free_bytes):
  """A filler file that leaves about `free_bytes` free (whole pages on tmpfs), removed on exit."""
  filler = log_dir / "filler.bin"
  with open(filler, "ab") as f:
    f.write(b"\0" * max(_free(log_dir) - free_bytes, 0))
  try:
    yield
  finally:
    filler.unlink()


def _assert_whole_lines(log_dir):
  """Every log file ends on a line end, and each line is a whole JSON record."""
  for name in os.listdir(log_dir):
    if name.endswith(".jsonl"):
      data = (log_dir / name).read_bytes()
      assert not data or data.endswith(b"\n"), f"{name} ends in a torn line"
      for line in data.splitlines():
        json.loads(line)


def _long_prompt(seed: int) -> str:
  """~17K tokens: a record of ~56 KB, more than is left below."""
  rng = random.Random(seed)
  return " ".join(str(rng.randrange(10**5)) for _ in range(3000))


def test_disk_full_loses_no_acknowledged_call_and_tears_no_line(tiny_log_dir, make_shim):
  shim = make_shim([FINAL_TURN], min_free_log_bytes=FLOOR)  # (Its log dir is tiny_log_dir.)
  acked: dict[str, int] = {}  # rollout id -> calls acknowledged

  def rollout():
    r = shim.create_rollout("t", "claude_code")
    acked[r["rollout_id"]] = 0
    return (r, anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0),
            openai.OpenAI(base_url=r["openai_base_url"], api_key=r["api_key"], max_retries=0))

  def anthropic_call(r, client, text, stream):
    assert anthropic_text(client, [{"role": "user", "content": text}], stream) == FINAL_TURN.text
    acked[r["rollout_id"]] += 1

  def openai_call(r, client, text, stream):
    assert openai_text(client, [{"role": "user", "content": text}], stream) == FINAL_TURN.text
    acked[r["rollout_id"]] += 1

  # Room above the floor, but less than a long call's record: the write fails part-way.
  failed = []
  with _leave_free(tiny_log_dir, FLOOR + 8 * 1024):
    for k, (call, stream, error) in enumerate([
        (anthropic_call, False, anthropic.InternalServerError),
        (anthropic_call, True, anthropic.APIStatusError),
        (openai_call, False, openai.InternalServerError),
        (openai_call, True, openai.APIError)]):
      r, a, o = rollout()
      with pytest.raises(error) as e:
        call(r, a if call is anthropic_call else o, _long_prompt(k), stream)
      body = e.value.body
      if call is anthropic_call:  # The Anthropic shape, in a response body or an `error` event alike.
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
        message = body["error"]["message"]
      else:  # The SDK hands on the OpenAI shape's "error" object.
        assert body["type"] == "server_error", body
        message = body["message"]
      assert "could not record this call" in message and "No space left" in message
      if not stream:
        assert e.value.status_code == 500
      _assert_whole_lines(tiny_log_dir)
      assert log_calls(r["log_path"]) == []  # Cut back to nothing: the failed record was the first.
      failed.append(r)
    # The Responses API: the same 500, or once streaming a response.failed event for response.completed.
    for stream, error in ((False, openai.InternalServerError), (True, ValueError)):
      r, _, o = rollout()
      with pytest.raises(error, match="could not record this call.*No space left"):
        responses_text(o, _long_prompt(10 + stream), stream)
      _assert_whole_lines(tiny_log_dir)
      assert log_calls(r["log_path"]) == []
      failed.append(r)
    # A short call still fits: acknowledged and on disk.
    r, a, o = rollout()
    anthropic_call(r, a, "hi", stream=True)
    openai_call(r, o, "hi", stream=False)
    assert responses_text(o, "hi", stream=True) == FINAL_TURN.text
    acked[r["rollout_id"]] += 1
    assert len(log_calls(r["log_path"])) == 3
  # Below the floor: 503 in each dialect's shape before anything is read or written; no new rollouts.
  with _leave_free(tiny_log_dir, FLOOR // 2):
    sizes = {n: os.path.getsize(tiny_log_dir / n) for n in os.listdir(tiny_log_dir)}
    r2 = failed[0]
    with pytest.raises(anthropic.InternalServerError) as e:
      anthropic.Anthropic(base_url=r2["base_url"], api_key=r2["api_key"], max_retries=0).messages.create(
          model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503 and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "overloaded_error" and "retry later" in e.value.body["error"]["message"]
    with pytest.raises(openai.InternalServerError) as e:
      openai.OpenAI(base_url=r2["openai_base_url"], api_key=r2["api_key"], max_retries=0
                    ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert e.value.status_code == 503 and e.value.body["type"] == "server_error"
    status, text = post(shim.url + "/rollouts", {"task_id": "t", "harness": "h"}, token=shim.admin_token)
    assert status == 503 and json.loads(text)["error"]["type"] == "server_error"
    assert {n: os.path.getsize(tiny_log_dir / n) for n in os.listdir(tiny_log_dir)
            if n != "filler.bin"} == {n: s for n, s in sizes.items() if n != "filler.bin"}
  # Space is back: the same shim serves, also the rollouts whose record failed (their next record
  # must not refer to the one that was never written).
  for r in failed[:2]:
    a = anthropic.Anthropic(base_url=r["base_url"], api_key=r["api_key"], max_retries=0)
    anthropic_call(r, a, _long_prompt(99), stream=True)
  r, a, o = rollout()
  openai_call(r, o, _long_prompt(100), stream=True)
  _assert_whole_lines(tiny_log_dir)
  loaded = calllog.load(tiny_log_dir)  # errors="raise": every line of every file is a valid record.
  assert {rid: sum(c.status == "ok" for c in loaded.calls.get(rid, [])) for rid in acked} == acked
  # A rollout with a call it could not record is marked failed, and the harness runner sees it so.
  client = ShimClient(shim.url, 30, shim.admin_token)
  for r in failed:
    with pytest.raises(ShimError, match="could not be recorded"):
      client.finish(r["rollout_id"])
  assert client.finish(list(acked)[-1])["failed"] is None
