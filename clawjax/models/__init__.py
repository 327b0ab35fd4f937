"""The policy model: a Flax NNX decoder family (Llama, Qwen3, Qwen3-MoE) over tree-packed batches.

Entry points: `config.ModelConfig` / `config.PRESETS`, `model.Decoder`, `hf_io.load` / `hf_io.save`,
`loading.load_model` (a preset or an HF dir by name), `smollm2.ensure_smollm2_dir`.
"""
