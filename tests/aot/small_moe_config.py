"""A Qwen3-MoE learner step small enough to compile in seconds, for v5e:2x2 (tests/aot)."""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
  c = config_dict.ConfigDict()
  c.tasks = config_dict.placeholder(str)  # a compile reads no tasks
  c.model = config_dict.ConfigDict({"init": "test-tiny-moe", "overrides": {
      "n_layers": 1, "dtype": "bfloat16", "attention_impl": "blocked", "attention_block": 128, "remat": True}})
  c.mesh = config_dict.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1, "expert": 1})
  c.compile = config_dict.ConfigDict({"topology": "v5e:2x2"})
  c.batch = config_dict.ConfigDict({"rows": 8, "row_len": 512})
  c.learner = config_dict.ConfigDict({"micro_batches": 2, "logits_chunk": 256})
  return c
