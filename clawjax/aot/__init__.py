"""Ahead-of-time compilation of a config's learner step for an accelerator slice, on a CPU host.

`topology` names slices ("v5p:4x4x4", "h200:1x1x8") and holds the chip table; `spec` reads what the step
needs from a train or SFT config; `step` builds the learner's update step from abstract parameters and
compiles it for the slice's compile-only devices; `flops` counts the step's FLOPs from the model's shapes;
`report` turns a compiled step into the figures experiments/compile.py prints.
"""
