"""What every run (training, evaluation) does in its workdir before the first rollout: record the
environment it runs on, check the isolation its config asks for (a config that needs bubblewrap fails
here, not at the first rollout), remove the rollout and relay dirs that killed runs left behind, and
install the run's harnesses (a phase line each; one that cannot install is left to fail its rollouts,
which then say why)."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Sequence
from typing import Any

from clawjax import environment, progress
from clawjax.config import ConfigError
from clawjax.harness import rundirs, sandbox
from clawjax.harness.adapters import get_adapter
from clawjax.harness.install import InstallError
from clawjax.harness.rollout import RolloutConfig

log = logging.getLogger(__name__)


def start_run(rollout: RolloutConfig, workdir: str | pathlib.Path, harnesses: Sequence[str] = (),
              record_environment: bool = True) -> dict[str, Any]:
  """Returns the isolation harnesses will run under (sandbox.isolation), for the run's summary.
  `record_environment`: write environment.json (one process of a multi-process run does)."""
  try:
    isolation = sandbox.isolation(rollout.sandbox)
  except sandbox.SandboxError as e:
    raise ConfigError(f"config.rollout.sandbox.mode: {e}") from None
  if isolation["sandbox"] == "none":
    log.warning("harnesses run WITHOUT isolation (sandbox mode %r: %s): an agent can read the checkers and "
                "other rollouts' files", rollout.sandbox.mode, isolation["sandbox_fallback"] or "asked for")
  for path in rundirs.remove_leftovers(rollout.work_root):
    log.info("removed %s, left by a run that was killed", path)
  if record_environment:
    environment.write_environment(workdir)
  for name in harnesses:
    try:
      with progress.phase(f"harness {name}: install"):
        get_adapter(name).install()
    except InstallError as e:
      log.warning("harness %s did not install (%s); its rollouts will fail and say why", name, e)
  return isolation
