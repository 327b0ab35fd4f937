"""Stage 2 of the data flow: rebuild each rollout's calls into a prefix tree, filter it, pack it."""
