"""Which lowering a compiled program's tree attention and MoE experts got, read from its HLO (not from the
config: the kernels are chosen per platform when the program is lowered, clawjax/kernels/tree_attention/dispatch.py
and clawjax/kernels/grouped_matmul/dispatch.py).

Each kernel's ops carry a name scope in their metadata (the two dispatch modules' `SCOPE`).
Among them, a kernel is a custom call whose target names its compiler. For attention, scope ops with no
such call are the kernel run by the Pallas interpreter (plain HLO loops), and no op in the scope means
attention of plain XLA ops ("dense" or "blocked"); the experts' scope without a kernel is `lax.ragged_dot`
("xla"), and no such scope a model without MoE layers (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from clawjax.kernels.grouped_matmul import dispatch as grouped_matmul
from clawjax.kernels.tree_attention import dispatch as tree_attention

# Custom-call targets of Pallas kernels, by compiler.
KERNEL_TARGETS = {"tpu_custom_call": "mosaic_tpu", "__gpu$xla.gpu.triton": "triton", "mosaic_gpu": "mosaic_gpu",
                  "mosaic_gpu_v2": "mosaic_gpu"}
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def _kernels_in_scope(hlo_texts: Iterable[str], scope: str) -> tuple[set[str], bool]:
  """(the compilers of the kernels among the ops in `scope`, whether any op is in it)."""
  # The scope as one component of an op's name path; jvp(...) / transpose(...) wrap it in the backward pass.
  in_scope = re.compile(rf"(?:^|[/(]){re.escape(scope)}(?:[/)]|$)")
  kernels, scoped = set(), False
  for text in hlo_texts:
    for line in text.splitlines():
      name = _OP_NAME.search(line)
      if not (name and in_scope.search(name.group(1))):
        continue
      scoped = True
      target = _TARGET.search(line)
      if target and target.group(1) in KERNEL_TARGETS:
        kernels.add(KERNEL_TARGETS[target.group(1)])
  return kernels, scoped


def attention_lowering(hlo_texts: Iterable[str]) -> str:
  """"mosaic_tpu", "mosaic_gpu", "triton", "interpret" or "xla" over compiled HLO modules (as_text());
  several, joined by "+", should one program hold kernels of several compilers."""
  kernels, scoped = _kernels_in_scope(hlo_texts, tree_attention.SCOPE)
  if kernels:
    return "+".join(sorted(kernels))
  return "interpret" if scoped else "xla"


def moe_lowering(hlo_texts: Iterable[str]) -> str | None:
  """"mosaic_tpu" (megablox), "mosaic_gpu", "xla" (`lax.ragged_dot`), or None without MoE layers."""
  kernels, scoped = _kernels_in_scope(hlo_texts, grouped_matmul.SCOPE)
  if kernels:
    return "+".join(sorted(kernels))
  return "xla" if scoped else None
