"""From inside a real bubblewrap sandbox, holding its rollout's key (all a harness gets), the shim's
control routes answer 401/403 and another rollout's model routes refuse the key; nothing changes."""
import json
import sys
import textwrap
import urllib.parse

import pytest

from clawjax.harness import sandbox

from tests.harness.helpers import load_rollout
from tests.serving.helpers import FINAL_TURN

pytestmark = pytest.mark.skipif(sandbox.bwrap_problem() is not None,
                                reason=f"bubblewrap unusable: {sandbox.bwrap_problem()}")

PROBE = """
import json, sys, urllib.error, urllib.request
own_base, own_key, other_id, other_base, root = sys.argv[1:]
def call(method, url, body=None, headers=()):
  req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                               method=method, headers={"content-type": "application/json", **dict(headers)})
  try:
    with urllib.request.urlopen(req, timeout=30) as resp:
      return resp.status
  except urllib.error.HTTPError as e:
    return e.code
bearer = [("Authorization", "Bearer " + own_key)]
key = [("x-api-key", own_key)]
message = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
print(json.dumps({
    "create": call("POST", root + "/rollouts", {"task_id": "t", "harness": "h"}),
    "create_with_key": call("POST", root + "/rollouts", {"task_id": "t", "harness": "h"}, bearer),
    "inspect_other": call("GET", root + "/rollouts/" + other_id),
    "inspect_other_with_key": call("GET", root + "/rollouts/" + other_id, headers=bearer),
    "finish_other": call("POST", root + "/rollouts/" + other_id + "/finish", {}),
    "finish_other_with_key": call("POST", root + "/rollouts/" + other_id + "/finish", {}, bearer),
    "finish_other_with_x_api_key": call("POST", root + "/rollouts/" + other_id + "/finish", {}, key),
    "other_rollout_with_key": call("POST", other_base + "/v1/messages", message, key),
    "own_rollout_with_key": call("POST", own_base + "/v1/messages", message, key),
}))
"""


def test_a_sandbox_cannot_use_the_control_routes_or_another_rollout(make_shim, tmp_path):
  shim = make_shim([FINAL_TURN])
  own, other = shim.create_rollout("t", "claude_code"), shim.create_rollout("t", "claude_code")
  ws, home = tmp_path / "ws", tmp_path / "home"
  ws.mkdir()
  home.mkdir()
  spec = sandbox.SandboxSpec(
      argv=[sys.executable, "-c", textwrap.dedent(PROBE), own["base_url"], own["api_key"],
            other["rollout_id"], other["base_url"], shim.url],
      workspace=ws, home=home, env={"PATH": "/usr/bin:/bin"}, timeout_s=60,
      stdout_path=tmp_path / "out", stderr_path=tmp_path / "err",
      loopback_ports=[urllib.parse.urlsplit(shim.url).port])
  result = sandbox.run(spec, sandbox.SandboxConfig(mode="bwrap"))
  assert result.returncode == 0 and result.sandbox == "bwrap", (tmp_path / "err").read_text()
  assert result.network == "loopback-relay"
  got = json.loads((tmp_path / "out").read_text())
  assert got == {"create": 401, "create_with_key": 403, "inspect_other": 401, "inspect_other_with_key": 403,
                 "finish_other": 401, "finish_other_with_key": 403, "finish_other_with_x_api_key": 401,
                 "other_rollout_with_key": 401, "own_rollout_with_key": 200}, got
  # Nothing changed: no new rollout, the other one live and untouched, the own call logged.
  assert sorted(r.rollout_id for r in shim.server.registry.live()) == sorted([own["rollout_id"],
                                                                             other["rollout_id"]])
  assert load_rollout(tmp_path / "logs", other["rollout_id"])[0] == []
  assert len(load_rollout(tmp_path / "logs", own["rollout_id"])[0]) == 1
