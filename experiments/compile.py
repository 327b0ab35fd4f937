r"""Compile a train or SFT config's learner step for an accelerator slice on this (CPU) host, and say
whether it fits and how fast it would run: nothing is allocated, no weights are read, no accelerator is
needed (TPU slices need `pip install 'clawjax[tpu]'`, GPU nodes `pip install 'clawjax[gpu-aot]'`).

  python experiments/compile.py --config=configs/paper/mix_harness_30a3b.py [--topology=v5p:4x4x4] [--json]

--topology defaults to the config's `compile.topology`. Prints the figures (with --json, one JSON
object), among them `attention_lowering`: what the compiled step runs its attention as ("mosaic_tpu",
"triton", "mosaic_gpu", "interpret" or "xla"), read from the compiled programs; a config that does not
fit its slice ends with one `error: ...` line naming the bytes needed and the chip's HBM, and status 1.
`--config.a.b=v` overrides apply as in training.
"""

import json
import os
import sys

# The host runs nothing but the compiler: with libtpu installed JAX would otherwise look for TPU chips.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags

from clawjax import cli
from clawjax.aot.report import compile_report
from clawjax.aot.spec import step_spec
from clawjax.config import ConfigError

_FLAGS = cli.define_flags("configs/*.py", None)
_TOPOLOGY = flags.DEFINE_string("topology", None, "slice to compile for, e.g. v5p:4x4x4 or v5e:2x2 "
                                "(default: the config's compile.topology)")
_JSON = flags.DEFINE_bool("json", False, "print one JSON object instead of text")
_FULL_DEPTH = flags.DEFINE_bool("full_depth", False, "compile every layer instead of extrapolating from 1 and 2")


def main(args: cli.Args) -> None:
  with cli.exit_on_errors(ValueError):  # a mesh the slice cannot take, in one line too
    spec, _ = _FLAGS.resolve(args, step_spec)
    slice_name = _TOPOLOGY.value or spec.topology
    if not slice_name:
      raise ConfigError("config.compile.topology: unset; pass --topology (e.g. v5p:4x4x4)")
    report = compile_report(spec, slice_name, full_depth=_FULL_DEPTH.value)
  print(json.dumps(report.as_json()) if _JSON.value else report.text(), flush=True)
  if not report.fits:
    sys.exit(f"error: {report.misfit()}")


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
