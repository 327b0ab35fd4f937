"""clawjax: black-box RL for the LLM behind an unmodified agent harness (ClawGym II), in JAX."""
