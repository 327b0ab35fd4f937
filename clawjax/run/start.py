"""What every run (training, evaluation) does in its workdir before the first rollout: record the
environment it runs on, check the isolation its config asks for (a config that needs bubblewrap fails
here, not at the first rollout), and remove the rollout and relay dirs that killed runs left behind."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from clawjax import environment
from clawjax.config import ConfigError
from clawjax.harness import rundirs, sandbox
from clawjax.harness.rollout import RolloutConfig

log = logging.getLogger(__name__)


def start_run(rollout: RolloutConfig, workdir: str | pathlib.Path) -> dict[str, Any]:
  """Returns the isolation harnesses will run under (sandbox.isolation), for the run's summary."""
  try:
    isolation = sandbox.isolation(rollout.sandbox)
  except sandbox.SandboxError as e:
    raise ConfigError(f"config.rollout.sandbox.mode: {e}") from None
  if isolation["sandbox"] == "none":
    log.warning("harnesses run WITHOUT isolation (sandbox mode %r: %s): an agent can read the checkers and "
                "other rollouts' files", rollout.sandbox.mode, isolation["sandbox_fallback"] or "asked for")
  for path in rundirs.remove_leftovers(rollout.work_root):
    log.info("removed %s, left by a run that was killed", path)
  environment.write_environment(workdir)
  return isolation
