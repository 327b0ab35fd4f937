"""The cold-start SFT stage (ClawII-Cold) and rejection-sampling fine-tuning from call logs.

  config.py    SFTRunConfig: the stage's typed configuration (experiments/sft.py, configs/sft/)
  data.py      readers: OpenAI-format and Anthropic-format trajectory JSONL, a run's call logs (RFT)
  render.py    a conversation -> the calls the shim would record for it (its template and PromptBuilder)
  dataset.py   every source -> prefix trees of trained tokens, cut or dropped to the length limit, counted
  packing.py   length-binned packing of trees into fixed-shape rows (segment ids), epoch by epoch
  loop.py      the update loop on the RL learner (the `sft` loss), checkpoints, metrics, held-out loss
  export.py    the trained policy as a Hugging Face directory (config, safetensors, tokenizer)
  stage.py     one SFT run in a workdir: `run_stage(config, workdir, metrics)`
"""
