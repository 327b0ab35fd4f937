"""Tree attention: the block-sparse Pallas kernels and their layout."""
