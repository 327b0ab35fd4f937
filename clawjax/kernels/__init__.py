"""The accelerator kernels, one folder per op, below the model (clawjax/models/ calls one function per op
and knows nothing of platforms). Each op's folder holds its plain-jnp or XLA reference, its kernels per
platform, the dispatch that picks one when the program is lowered (and says why), and `check.py`: the
kernel against the reference, which the tests, scripts/device_check.py and the op's benchmark all run.

  tree_attention/  GQA attention under the tree mask ("dense", "blocked", "pallas": Mosaic TPU, Triton GPU)
  grouped_matmul/  the MoE experts' grouped matmul (megablox, Mosaic GPU, `lax.ragged_dot`)
  precision.py     the float32-output matmul with mixed-precision gradients that references and model share

A module here imports nothing of clawjax but `clawjax.config` and `clawjax.sharding`
(tests/test_layering.py).
"""
