"""The accelerator kernels, one folder per op, below the model."""
