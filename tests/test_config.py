"""clawjax/config.py's checks that every run config shares: a number outside the range its field declares,
a key of a dict field that the dataclass it feeds does not have, a config file that is missing or fails
(`--config=FILE[:ARG]`): each a one-line ConfigError naming the field or the file (and its line)."""
from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import typing

import pytest

from clawjax import config as config_lib
from clawjax.config import ConfigError, Range
from clawjax.evaluation.config import EvalConfig
from clawjax.sft.config import SFTRunConfig
from clawjax.tasks import bundled_tasks_dir
from clawjax.train.config import TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASKS = str(bundled_tasks_dir())
SFT_DATA = str(ROOT / "clawjax" / "data" / "sft" / "train.jsonl")
# The smallest valid config of each run: the fields without a default.
# TrainConfig's own default harness (openclaw) needs more context than the embedded engine's default.
RUNS = {TrainConfig: {"tasks": TASKS, "harnesses": ("mini",)},
        SFTRunConfig: {"data": {"openai": [SFT_DATA]}, "model": {"init": "test-tiny"}, "tensorboard": False},
        EvalConfig: {"tasks": TASKS, "model": {"init": "test-tiny"}}}


def _ranged_fields(root: type) -> list[tuple[str, type, str, Range]]:
  """(dotted path, dataclass, field, range) of every field with a declared range under `root`."""
  out, seen = [], set()

  def walk(cls: type, prefix: str) -> None:
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
      bound = config_lib._range_of(hint)  # pylint: disable=protected-access
      if bound is not None:
        out.append((prefix + name, cls, name, bound))
      nested = config_lib._dataclass_in(typing.get_type_hints(cls)[name])  # pylint: disable=protected-access
      if nested is not None and (prefix + name) not in seen:
        seen.add(prefix + name)
        walk(nested, f"{prefix}{name}.")
  walk(root, "")
  return out


def _outside(bound: Range, is_int: bool) -> list[float]:
  """Values just outside `bound` (and not finite)."""
  step = 1 if is_int else 1e-3
  values = [math.nan] if not is_int else []
  if bound.low is not None:
    values.append(bound.low if bound.open_low else bound.low - step)
  if bound.high is not None:
    values.append(bound.high if bound.open_high else bound.high + step)
  return values


@pytest.mark.parametrize("root", list(RUNS), ids=lambda c: c.__name__)
def test_every_declared_range_holds_its_default_and_refuses_values_outside(root):
  fields = _ranged_fields(root)
  assert len(fields) >= 15  # learning rates, counts, probabilities and timeouts of every section
  config_lib.resolve(root, RUNS[root])
  for path, cls, name, bound in fields:
    default = {f.name: f for f in dataclasses.fields(cls)}[name]
    value = default.default if default.default is not dataclasses.MISSING else None
    assert value is None or bound.holds(value), (path, value, bound)
    is_int = config_lib._without_none(typing.get_type_hints(cls)[name]) is int  # pylint: disable=protected-access
    for bad in _outside(bound, is_int):
      text = str(int(bad)) if is_int else repr(bad)
      overrides = [f"{path}={text}"]
      if path.startswith("rollout.judge."):  # an optional section: on once its url and model are set
        overrides += ["rollout.judge.url=http://judge/v1", "rollout.judge.model=judge"]
      with pytest.raises(ConfigError, match=rf"^config\.{re.escape(path)}: must be .*{re.escape(str(bound))}, "
                                            r"got ") as err:
        config_lib.resolve(root, RUNS[root], overrides)
      assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides, message", [
    (["learner.lr=-1"], r"^config\.learner\.lr: must be > 0, got -1\.0$"),
    (["learner.lr=inf"], r"^config\.learner\.lr: must be a finite number > 0, got inf$"),
    (["shim.top_p=0"], r"^config\.shim\.top_p: must be in \(0, 1\], got 0\.0$"),
    (["rollout.timeout_s=0"], r"^config\.rollout\.timeout_s: must be > 0, got 0\.0$"),
    (["learner.adam_b2=1"], r"^config\.learner\.adam_b2: must be in \[0, 1\), got 1\.0$"),
    (["learner.grad_clip=-1"], r"^config\.learner\.grad_clip: must be > 0"),
    (["batch.max_staleness=-1"], r"^config\.batch\.max_staleness: must be >= 0, got -1$"),
])
def test_meaningless_numbers_are_refused(overrides, message):
  with pytest.raises(ConfigError, match=message):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], overrides)


def test_values_inside_the_range_and_none_are_taken():
  cfg = config_lib.resolve(TrainConfig, RUNS[TrainConfig],
                           ["learner.lr=3e-7", "learner.grad_clip=none", "shim.top_p=1", "shim.temperature=0.5",
                            "learner.temperature=0.5"])
  assert (cfg.learner.lr, cfg.learner.grad_clip, cfg.shim.top_p, cfg.shim.temperature) == (3e-7, None, 1.0, 0.5)


def test_dict_fields_feeding_a_dataclass_name_a_wrong_key():
  with pytest.raises(ConfigError, match=r"^config\.model\.overrides\.d_modle: not a field of ModelConfig; did you "
                                        r"mean d_model\?$"):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], ["model.overrides.d_modle=32"])
  with pytest.raises(ConfigError, match=r"^config\.engine\.options\.max_slot: not a field of EngineConfig; did you "
                                        r"mean max_slots"):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], ["engine.options.max_slot=4"])
  with pytest.raises(ConfigError, match=r"^config\.engine\.options: .*max_slots='many' is not a int"):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], ["engine.options.max_slots=many"])
  cfg = config_lib.resolve(TrainConfig, RUNS[TrainConfig], ["model.overrides.d_model=32", "engine.options.max_slots=4"])
  assert (cfg.model.overrides, cfg.engine.options) == ({"d_model": 32}, {"max_slots": 4})


def test_a_model_that_no_run_could_load_is_named_with_the_close_presets(tmp_path):
  with pytest.raises(ConfigError, match=r"^config\.model\.init: 'smollm2-13m' is neither a preset nor a directory "
                                        r"with config\.json; did you mean smollm2-135m\?$"):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], ["model.init=smollm2-13m"])
  with pytest.raises(ConfigError, match=r"^config\.model\.init: .*the presets: test-tiny"):
    config_lib.resolve(SFTRunConfig, RUNS[SFTRunConfig], [f"model.init={tmp_path}"])  # a directory, no config.json
  with pytest.raises(ConfigError, match=r"^config\.model\.init: 'qwen3-8' .*did you mean qwen3-8b"):
    config_lib.resolve(EvalConfig, RUNS[EvalConfig], ["model.init=qwen3-8"])
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ConfigError, match=r"^config\.model\.random_init: needs a preset"):
    config_lib.resolve(TrainConfig, RUNS[TrainConfig], [f"model.init={tmp_path}", "model.random_init=true"])
  # An evaluation through a running engine names the model by its tokenizer: nothing is loaded here.
  assert config_lib.resolve(EvalConfig, RUNS[EvalConfig], ["model.init=qwen3", "engine.backend=sglang",
                                                           "engine.url=http://e:1"]).model.init == "qwen3"


def test_a_config_file_that_is_missing_or_fails_is_one_line_naming_it(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  with pytest.raises(ConfigError, match=r"^--config=configs/quickstrat\.py: no such file; did you mean "
                                        r"configs/quickstart\.py, configs/quickstart_moe\.py\?$"):
    config_lib.load_config_file("configs/quickstrat.py")
  with pytest.raises(ConfigError, match=r"^--config=nowhere/x\.py: no such file$"):
    config_lib.load_config_file("nowhere/x.py")
  with pytest.raises(ConfigError, match=r"^--config=configs/eval/clawgym_bench\.py:pinch: the benchmark 'pinch' "
                                        r"\(after the colon\): expected one of \['clawgym_bench', 'pinchbench'\]$"):
    config_lib.load_config_file("configs/eval/clawgym_bench.py:pinch")
  with pytest.raises(ConfigError, match=r"^--config=configs/quickstart\.py:x: TypeError: get_config\(\) takes 0 "):
    config_lib.load_config_file("configs/quickstart.py:x")
  broken = tmp_path / "broken.py"
  broken.write_text("from ml_collections import config_dict\n\n\ndef get_config():\n  return nope\n")
  with pytest.raises(ConfigError, match=rf"^--config={re.escape(str(broken))}: {re.escape(str(broken))}:5: "
                                        r"NameError: name 'nope' is not defined$"):
    config_lib.load_config_file(str(broken))
  broken = tmp_path / "syntax.py"
  broken.write_text("def get_config(:\n")
  with pytest.raises(ConfigError, match=rf":1: SyntaxError: "):
    config_lib.load_config_file(str(broken))
  (tmp_path / "empty.py").write_text("X = 1\n")
  with pytest.raises(ConfigError, match=r"empty\.py defines no get_config\(\)$"):
    config_lib.load_config_file(str(tmp_path / "empty.py"))
  assert config_lib.load_config_file("configs/eval/clawgym_bench.py:pinchbench").benchmark == "PinchBench"
