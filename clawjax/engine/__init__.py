"""The embedded JAX rollout engine: KV-cache generation with the learner's own Decoder.

  engine.py       Engine / EngineConfig: continuous batching, prefix reuse, versioned weight updates
  kv_forward.py   jitted prefill / k-step decode programs over a slotted KV cache (bucketed static shapes)
  placement.py    the engine's devices, and those a learner beside it keeps
  sampling.py     greedy / temperature / top-k / top-p sampling and the log-prob convention
  prefix_cache.py which token prefix each cache slot still holds
  server.py       SGLang's native HTTP protocol (`python -m clawjax.engine --model ... --port ...`)
"""
