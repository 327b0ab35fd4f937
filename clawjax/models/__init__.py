"""The policy model: a Flax NNX decoder family (Llama, Qwen3, Qwen3-MoE) over tree-packed batches.

Entry points: `config.ModelConfig` / `config.PRESETS`, `model.Decoder`, `hf_io.load` / `hf_io.save`,
`smollm2.ensure_smollm2_dir`.
"""
