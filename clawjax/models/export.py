"""A training run's checkpoint as a Hugging Face safetensors directory (config.json, weights, tokenizer
files) that transformers, vLLM, SGLang and the embedded engine load.

  python -m clawjax.models export --checkpoint RUN/checkpoints/N --out DIR

The architecture comes from the run's config.json (`model.init` + `model.overrides`, rebuilt with
`load_model`); the weights are the policy parameters of the learner's train state saved at step N
(clawjax/rl/checkpoint.py: an Orbax item "state" holding the flattened state, the policy's parameters
under "params.policy."). Only those are read (the optimizer state, critic and reference policy stay on
disk). Tokenizer files: copied from the model directory `model.template` or `model.init` names where it
is one, otherwise the named tokenizer (a preset's, clawjax.models.vocab) is written as tokenizer.json
with a tokenizer_config.json.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from clawjax.models import hf_io
from clawjax.models.loading import REAL_PRESETS, load_model, real_preset_dir
from clawjax.models.model import Decoder
from clawjax.models.vocab import text_source
from clawjax.sharding import flat_name
from clawjax.text.tokenizer import load_tokenizer

STATE_ITEM = "state"              # the train state's item in a checkpoint step directory
POLICY_PREFIX = "params.policy."  # the policy's parameters in that flattened state
RUN_CONFIG = "config.json"        # the run's resolved config, beside checkpoints/


def run_model_settings(config_file: str | os.PathLike[str]) -> dict[str, Any]:
  """The `model` section and `seed` of a run's config.json."""
  path = pathlib.Path(config_file)
  try:
    cfg = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read the run's config: {e}") from None
  model = cfg.get("model") if isinstance(cfg, dict) else None
  if not isinstance(model, dict) or not model.get("init"):
    raise ValueError(f"{path}: field 'model.init' missing: not a training run's config.json")
  return {**model, "seed": cfg.get("seed", 0)}


def restore_policy(model: Decoder, step_dir: str | os.PathLike[str]) -> Decoder:
  """`model` with the policy parameters of the checkpoint step directory `step_dir` (RUN/checkpoints/N)."""
  item = pathlib.Path(step_dir).absolute() / STATE_ITEM
  if not item.is_dir():
    raise ValueError(f"{step_dir}: no {STATE_ITEM}/ inside: not a checkpoint step directory (RUN/checkpoints/N)")
  leaves, treedef = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  names = [POLICY_PREFIX + flat_name(path) for path, _ in leaves]
  abstract = {n: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for n, (_, v) in zip(names, leaves)}
  with ocp.PyTreeCheckpointer() as ckptr:
    try:
      saved = ckptr.restore(item, args=ocp.args.PyTreeRestore(
          item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))
    except (ValueError, KeyError) as e:
      raise ValueError(f"{item}: the checkpoint does not hold this architecture's policy "
                       f"(is config.json's model the run's?): {e}") from None
  missing = [n for n in names if not isinstance(saved.get(n), jax.Array)]  # partial restore leaves them abstract
  if missing:
    raise ValueError(f"{item}: the checkpoint lacks {missing[:3]} (of {len(missing)})")
  nnx.update(model, jax.tree_util.tree_unflatten(treedef, [saved[n] for n in names]))
  return model


def _tokenizer_files(model: dict[str, Any], out: pathlib.Path) -> None:
  source = model.get("template") or model["init"]
  if source in REAL_PRESETS:
    source = str(real_preset_dir(source))
  path = pathlib.Path(source)
  if path.is_dir() and (path / "tokenizer.json").is_file():
    for name in hf_io.SIDE_FILES:
      if (path / name).is_file() and not (out / name).exists():
        (out / name).write_bytes((path / name).read_bytes())
    return
  tokenizer = load_tokenizer(text_source(source))
  tokenizer.hf.save(str(out / "tokenizer.json"))
  config = json.loads((out / "config.json").read_text())
  eos = config.get("eos_token_id")
  (out / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
      "model_max_length": config.get("max_position_embeddings"),
      **({"eos_token": tokenizer.hf.id_to_token(eos)} if eos is not None else {})}, indent=2) + "\n")


def export(step_dir: str | os.PathLike[str], out: str | os.PathLike[str],
           config_file: str | os.PathLike[str] | None = None) -> pathlib.Path:
  """Writes the HF directory `out` from checkpoint `step_dir`; `config_file` defaults to the run's
  config.json two levels up (RUN/checkpoints/N -> RUN/config.json)."""
  step_dir = pathlib.Path(step_dir)
  model_cfg = run_model_settings(config_file or step_dir.absolute().parents[1] / RUN_CONFIG)
  model = load_model(model_cfg["init"], seed=model_cfg["seed"], random_init=model_cfg.get("random_init", False),
                     **(model_cfg.get("overrides") or {})).model
  out = hf_io.save(restore_policy(model, step_dir), out)
  _tokenizer_files(model_cfg, out)
  return out
