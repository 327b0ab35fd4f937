"""A config's learner step compiled for a slice, as figures: bytes per device against the chip's HBM,
FLOPs and tokens per step, and the step time at the chip's peak (the larger of compute and HBM time).

With remat the Decoder runs its layers as a scan (clawjax/models/model.py), so the whole depth compiles
about as fast as one layer and is compiled whole. Without remat the layers are a Python loop, and
compiling 48 layers of a 64K-token step takes this host (2 CPU cores) long: such a model deeper than
`FULL_DEPTH_MAX` layers is compiled at 1 and 2 layers and its bytes extrapolated linearly to the full
depth (each layer adds the same parameters, optimizer state and saved activations), never below the
deeper compile; the report says so (`layers_compiled`, `extrapolated`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clawjax import sharding
from clawjax.aot import flops, measured, step, topology
from clawjax.aot.spec import StepSpec

FULL_DEPTH_MAX = 4
_BYTE_FIELDS = ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "routes_bytes")


@dataclasses.dataclass(frozen=True)
class Report:
  topology: str
  devices: int
  chip: str
  mesh: dict[str, int]
  model: str
  attention_impl: str
  attention_lowering: str | None     # what the compiled step runs it as (clawjax/aot/lowering.py); None if refused
  moe_lowering: str | None           # the same for the MoE's experts; None without MoE layers too
  remat: bool
  layers: int
  layers_compiled: tuple[int, ...]
  extrapolated: bool
  compiler_refused: bool             # the TPU compiler stopped at its HBM check; its temporaries are reported
  bytes_per_device: dict[str, int]   # arguments, outputs, aliased (donated), temporaries, total
  hbm_bytes_per_device: int
  # Of the arguments: the replayed routes (rollout routing replay of a MoE policy); 0 when not replaying.
  routes_bytes_per_device: int
  fits: bool
  rows: int
  row_len: int
  micro_batches: int
  tokens_per_step: int
  active_params: int
  flops_per_step: float              # analytical (clawjax/aot/flops.py), every device together
  model_flops_per_step: float        # the same without layer recompute
  compiler_flops_per_step: float | None  # XLA's per-device count x devices (loop bodies once); None on GPU
  est_compute_s: float
  est_hbm_s: float
  est_step_s: float
  mfu: float
  tokens_per_s_per_chip: float
  # The step at the MFU measured on this chip for this model kind (clawjax/aot/measured.py): None where
  # the chip and kind were never measured.
  measured_mfu: float | None
  measured: dict[str, Any] | None   # the measurement: its row length, date and what was measured
  est_step_s_at_measured_mfu: float | None

  def as_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def misfit(self) -> str:
    gib = lambda b: f"{b / topology.GIB:.1f} GiB"
    return (f"does not fit {self.topology}: the step needs {gib(self.bytes_per_device['total'])} per device, "
            f"a {self.chip} chip has {gib(self.hbm_bytes_per_device)} of HBM")

  def text(self) -> str:
    gib = lambda b: f"{b / topology.GIB:.2f} GiB" if b >= topology.GIB / 10 else f"{b / 2 ** 20:.1f} MiB"
    b = self.bytes_per_device
    depth = (f"{self.layers} layers, extrapolated from compiles at {list(self.layers_compiled)}"
             if self.extrapolated else f"{self.layers} layers compiled")
    if self.compiler_refused:
      depth += "; the compiler refused it over HBM, temporaries as it counted them"
    return "\n".join([
        f"topology      {self.topology}: {self.devices} x {self.chip}, mesh {self.mesh}",
        f"model         {self.model} ({depth}), attention {self.attention_impl} (lowered: {self.attention_lowering}), "
        f"{f'MoE experts lowered: {self.moe_lowering}, ' if self.moe_lowering else ''}remat {self.remat}",
        f"batch         {self.rows} rows x {self.row_len} tokens, {self.micro_batches} micro-batches",
        f"per device    arguments {gib(b['arguments'])}, outputs {gib(b['outputs'])} ({gib(b['aliased'])} "
        f"donated), temporaries {gib(b['temporaries'])}, total {gib(b['total'])} of {gib(self.hbm_bytes_per_device)}"
        f" HBM: {'fits' if self.fits else 'DOES NOT FIT'}"
        f"{f'; replayed routes {gib(self.routes_bytes_per_device)} of the arguments' if self.routes_bytes_per_device else ''}",
        f"FLOPs/step    {self.flops_per_step:.3e} (model {self.model_flops_per_step:.3e}; compiler, loop bodies "
        f"once: {self.compiler_flops_per_step if self.compiler_flops_per_step is None else f'{self.compiler_flops_per_step:.3e}'})",
        f"tokens/step   {self.tokens_per_step} ({self.active_params / 1e9:.2f}B active parameters)",
        f"step time     {self.est_step_s:.2f} s at peak (compute {self.est_compute_s:.2f} s, HBM {self.est_hbm_s:.2f} s),"
        f" MFU {self.mfu:.1%}, {self.tokens_per_s_per_chip:.0f} tokens/s per chip",
        f"              {self._measured_text()}",
    ])

  def _measured_text(self) -> str:
    if self.measured is None:
      return f"no MFU measured on {self.chip} for this model kind yet: only the time at peak"
    m = self.measured
    return (f"{self.est_step_s_at_measured_mfu:.2f} s at the MFU measured on {self.chip} ({self.measured_mfu:.1%}, "
            f"{m['kind']}, {m['row_len']}-token rows, {m['date']}: {m['what']})")


def _extrapolate(compiled: list[step.CompiledStep], layers: int) -> dict[str, float]:
  """Each byte figure (and XLA's FLOPs) at `layers`, linear in the layer count through the compiles."""
  if len(compiled) == 1:
    one = compiled[0]
    return {f: getattr(one, f) for f in _BYTE_FIELDS + ("compiler_flops",)}
  a, b = compiled
  # A layer never frees memory: a compile whose second layer costs less than its first (the scheduler
  # placed them differently) is extrapolated as flat from the deeper one, not below it.
  line = lambda x, y: y + max(0.0, (y - x) / (b.layers - a.layers)) * (layers - b.layers)
  out = {f: line(getattr(a, f), getattr(b, f)) for f in _BYTE_FIELDS}
  out["compiler_flops"] = None if None in (a.compiler_flops, b.compiler_flops) else line(a.compiler_flops, b.compiler_flops)
  return out


def compile_report(spec: StepSpec, slice_name: str, *, full_depth: bool = False) -> Report:
  """Compiles `spec`'s step for the slice `slice_name` and measures it."""
  target = topology.parse(slice_name)
  mesh = sharding.make_mesh(spec.mesh, topology.devices(target))
  layers = spec.model.n_layers
  depths = [layers] if full_depth or spec.model.remat or layers <= FULL_DEPTH_MAX else [1, 2]
  compiled = [step.compile_step(spec, mesh, n) for n in depths]
  figures = _extrapolate(compiled, layers)
  byte = {name: int(figures[f]) for name, f in zip(("arguments", "outputs", "aliased", "temporaries"), _BYTE_FIELDS)}
  routes_bytes = int(figures["routes_bytes"])
  byte["total"] = byte["arguments"] + byte["outputs"] - byte["aliased"] + byte["temporaries"]
  layout = step.batch_layout(spec, mesh)
  n = target.device_count
  count = flops.step_count(spec.model, spec.learner, rows=layout.rows, row_len=layout.row_len,
                           loss_slots=layout.loss_slots, devices=n,
                           weight_shards=mesh.shape["tensor"] * mesh.shape["expert"])
  chip = target.chip
  compute_s = count.flops / (n * chip.peak_flops)
  hbm_s = count.hbm_bytes / chip.hbm_bandwidth
  step_s = max(compute_s, hbm_s)
  tokens = layout.rows * layout.row_len
  compiler = figures["compiler_flops"]
  seen = measured.lookup(target.chip_name, "moe" if spec.model.n_experts else "dense", layout.row_len)
  return Report(
      topology=slice_name, devices=n, chip=target.chip_name, mesh=dict(mesh.shape), model=spec.model_name,
      attention_impl=spec.model.attention_impl,
      attention_lowering=next((c.attention_lowering for c in compiled if c.attention_lowering), None),
      moe_lowering=next((c.moe_lowering for c in compiled if c.moe_lowering), None),
      remat=spec.model.remat, layers=layers,
      layers_compiled=tuple(depths), extrapolated=depths != [layers],
      compiler_refused=any(c.refused for c in compiled), bytes_per_device=byte,
      hbm_bytes_per_device=chip.hbm_bytes, routes_bytes_per_device=routes_bytes, fits=byte["total"] <= chip.hbm_bytes and not any(c.refused for c in compiled), rows=layout.rows,
      row_len=layout.row_len, micro_batches=spec.learner.micro_batches, tokens_per_step=tokens,
      active_params=flops.active_params(spec.model), flops_per_step=count.flops,
      model_flops_per_step=count.model_flops, compiler_flops_per_step=None if compiler is None else compiler * n,
      est_compute_s=compute_s, est_hbm_s=hbm_s, est_step_s=step_s,
      mfu=count.model_flops / (step_s * n * chip.peak_flops), tokens_per_s_per_chip=tokens / step_s / n,
      measured_mfu=None if seen is None else seen.mfu, measured=None if seen is None else dataclasses.asdict(seen),
      est_step_s_at_measured_mfu=None if seen is None else count.model_flops / (n * chip.peak_flops * seen.mfu))
