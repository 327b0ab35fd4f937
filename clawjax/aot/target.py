"""The `compile` section of a train or SFT config: what experiments/compile.py compiles it for."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CompileTarget:
  # The accelerator slice the config is sized for ("v5p:4x4x4", "h200:1x1x8"; clawjax/aot/topology.py):
  # experiments/compile.py's default --topology.
  topology: str | None = None
  # The architecture (a clawjax.models.config preset) compiled when model.init is a placeholder, as in the
  # paper configs, whose weights are a path given at launch.
  model: str | None = None
