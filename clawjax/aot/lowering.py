"""Which lowering a compiled program's tree attention got, read from its HLO (not from the config: the
kernel is chosen per platform when the program is lowered, clawjax/models/pallas_attention.py).

The Pallas kernel's ops carry the name scope `pallas_attention.SCOPE` in their metadata. Among them, a
kernel is a custom call whose target names its compiler; scope ops with no such call are the kernel run
by the Pallas interpreter (plain HLO loops); no op in the scope means attention of plain XLA ops
("dense" or "blocked").
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from clawjax.models.pallas_attention import SCOPE

# Custom-call targets of Pallas kernels, by compiler.
KERNEL_TARGETS = {"tpu_custom_call": "mosaic_tpu", "__gpu$xla.gpu.triton": "triton", "mosaic_gpu": "mosaic_gpu",
                  "mosaic_gpu_v2": "mosaic_gpu"}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
# The scope as one component of an op's name path; jvp(...) / transpose(...) wrap it in the backward pass.
_IN_SCOPE = re.compile(rf"(?:^|[/(]){re.escape(SCOPE)}(?:[/)]|$)")


def attention_lowering(hlo_texts: Iterable[str]) -> str:
  """"mosaic_tpu", "mosaic_gpu", "triton", "interpret" or "xla" over compiled HLO modules (as_text());
  several, joined by "+", should one program hold kernels of several compilers."""
  kernels, scoped = set(), False
  for text in hlo_texts:
    for line in text.splitlines():
      name = _OP_NAME.search(line)
      if not (name and _IN_SCOPE.search(name.group(1))):
        continue
      scoped = True
      target = _TARGET.search(line)
      if target and target.group(1) in KERNEL_TARGETS:
        kernels.add(KERNEL_TARGETS[target.group(1)])
  if kernels:
    return "+".join(sorted(kernels))
  return "interpret" if scoped else "xla"
