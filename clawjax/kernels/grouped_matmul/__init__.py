"""Grouped matmul: the MoE experts' kernels and their check."""
