"""Every training config loads into a valid TrainConfig, documents its own command, takes every field
from the command line, and a mistyped key, type or name is a one-line error naming the field before
anything starts (also through experiments/train.py itself)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from clawjax import sharding
from clawjax.aot import topology
from clawjax.config import ConfigError, schema_paths, to_json
from clawjax.rl.config import LearnerConfig
from clawjax.rl.learner import Learner
from clawjax.rl.losses import LOSSES
from clawjax.tasks import bundled_tasks_dir
from clawjax.train.config import TrainConfig, check_resume, train_config
from clawjax.train.trainer import Trainer
from tests.rl.learner_batches import make_policy, random_tree, rel_diff, tree_layout

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.py")) + sorted(
    p for p in (ROOT / "configs" / "paper").glob("*.py") if p.name != "common.py") + [
        ROOT / "configs" / "smollm2" / "grpo.py"]
# Rollouts a step: the paper's 256; the CPU configs' fewer, so a step's learner update stays short.
ROLLOUTS_PER_STEP = {"quickstart": 32, "quickstart_moe": 32, "grpo": 16}
TASKS = str(bundled_tasks_dir())


def _load(path: pathlib.Path):
  spec = importlib.util.spec_from_file_location(path.stem, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _filled(path: pathlib.Path):
  c = _load(path).get_config()
  if c.tasks is None:
    c.tasks = TASKS
  if c.model.get("init") is None:
    c.model.init = "qwen3-30b-a3b"
  return c


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_is_valid_and_shows_its_command(path):
  module = _load(path)
  rel = path.relative_to(ROOT).as_posix()
  assert f"python experiments/train.py --config={rel}" in module.__doc__
  cfg = train_config(_filled(path))
  assert cfg.learner.temperature == cfg.shim.temperature
  assert cfg.tasks_per_step * cfg.rollouts_per_task * len(cfg.harnesses) == ROLLOUTS_PER_STEP.get(path.stem, 256)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_field_is_settable_whatever_the_file_sets(path):
  # Fields the quickstart and paper files leave out, at three depths, and a key inside a dict field.
  cfg = train_config(_filled(path), ["learner.kl_coef=0.05", "learner.eps_high=0.3",
                                     "rollout.sandbox.isolate_network=false", "model.overrides.remat=True",
                                     "task_ids=a,b", "filters.max_leaves=17"])
  assert (cfg.learner.kl_coef, cfg.learner.eps_high, cfg.rollout.sandbox.isolate_network) == (0.05, 0.3, False)
  assert cfg.model.overrides["remat"] is True and cfg.task_ids == ("a", "b") and cfg.filters.max_leaves == 17
  assert "learner.value.pretrain_lr" in schema_paths(TrainConfig)


def test_paper_configs_follow_the_paper():
  by_name = {p.stem: train_config(_filled(p)) for p in CONFIGS if p.parent.name == "paper"}
  assert by_name["mix_harness_30a3b"].harnesses == ("openclaw", "claude_code")
  assert by_name["mix_harness_30a3b"].tasks_per_step == 16
  assert by_name["grpo_codex_30a3b"].harnesses == ("codex",)
  # Mix-harness takes any of the three harnesses.
  mix = _filled(ROOT / "configs" / "paper" / "mix_harness_30a3b.py")
  assert train_config(mix, ["harnesses=codex,claude_code,openclaw"]).harnesses == ("codex", "claude_code", "openclaw")
  assert by_name["ppo_openclaw_30a3b"].learner.loss == "ppo"
  assert (by_name["ppo_openclaw_30a3b"].tasks_per_step, by_name["ppo_openclaw_30a3b"].rollouts_per_task) == (256, 1)
  assert all(c.shim.max_context == 65_536 for c in by_name.values())
  # Qwen3-30B-A3B's 8 experts a token: each call asks SGLang for its routes, which the learner replays.
  assert all(c.engine.options["routed_experts"] == 8 and c.learner.routing_replay == "auto" for c in by_name.values())
  assert all(c.tasks_per_step * c.rollouts_per_task * len(c.harnesses) == 256 for c in by_name.values())


def test_paper_configs_name_a_slice_their_micro_batches_fill():
  # Each micro-batch gives every row shard of the named slice (its data x fsdp devices; tensor and expert
  # split a row's math) whole rows, exactly one at 64K tokens (compiled figures: BENCHMARKS.md).
  for path in [p for p in CONFIGS if p.parent.name == "paper"]:
    cfg = train_config(_filled(path))
    devices = topology.parse(cfg.compile.topology).device_count
    row_shards = sharding.batch_shards(jax.sharding.AbstractMesh(cfg.mesh.shape(devices), sharding.MESH_AXES))
    assert cfg.compile.model == "qwen3-30b-a3b" and cfg.model.overrides["remat"], path.stem
    assert cfg.batch.rows == cfg.learner.micro_batches * row_shards, path.stem


QUICKSTART = ROOT / "configs" / "quickstart.py"


@pytest.mark.parametrize("overrides, message", [
    (["kl_coef=0.1"], r"^config\.kl_coef: unknown field; did you mean learner\.kl_coef\?$"),
    (["learner.kl_cof=0.1"], r"^config\.learner\.kl_cof: unknown field; did you mean learner\.kl_coef"),
    (["learner.lr=fast"], r"^config\.learner\.lr: cannot read 'fast' as float"),
    (["progress=maybe"], r"^config\.progress: cannot read 'maybe' as bool"),
    (["learner.loss=grpoo"], r"^config\.learner\.loss: 'grpoo' is not a registered loss .*did you mean grpo\?"),
    (["learner.loss=ppo"], r"^config\.learner\.value\.kind: loss 'ppo' reads values, which is off"),
    (["harnesses=mini,cline"], r"^config\.harnesses: \['mini', 'cline'\] must be a non-empty subset"),
    (["engine.backend=scripted"], r"^config\.engine\.backend: 'scripted': training updates the engine's weights"),
    (["engine.backend=tgi"], r"^config\.engine\.backend: 'tgi' is not one of"),
    (["tasks=/no/such/dir"], r"^config\.tasks: '/no/such/dir' does not exist"),
    (["learner"], r"^--config\.learner: expected --config\.FIELD=VALUE"),
    (["learner=3"], r"^config\.learner: cannot read '3' as LearnerConfig"),
    (["plugins=no_such_module_xyz"], r"^config\.plugins: cannot import 'no_such_module_xyz'"),
    (["sft.demonstrator=clawjax.data.quickstart.demonstrator:Nope"], r"^config\.sft\.demonstrator: cannot import"),
    (["async_rl=true"], r"^config\.async_rl: needs batch\.max_staleness >= 1"),
    (["learner.loss=ppo", "learner.value.kind=shared", "batch.drop_uninformative_groups=true"],
     r"^config\.batch\.drop_uninformative_groups: drops the groups whose GRPO advantages are all 0, but "
     r"learner\.loss 'ppo'"),
    (["shim.workers=2"], r"^config\.shim\.workers: 2 shim processes cannot share the embedded engine"),
    (["harnesses=codex", "shim.max_context=8192", "rollout.harness.codex_compact_reserve=8192"],
     r"^config\.rollout\.harness\.codex_compact_reserve: 8192 must be at least 0 and below shim\.max_context"),
    (["harnesses=codex", "rollout.harness.codex_compact_reserve=-1"],
     r"^config\.rollout\.harness\.codex_compact_reserve: must be >= 0, got -1$"),
    (["engine.push_mode=flush"], r"^config\.engine\.push_mode: 'flush' is not one of \('drain', 'abort'\)"),
    (["engine.options={'update_mode': 'abort'}"], r"^config\.engine\.options\.update_mode: set config\.engine\.push_mode"),
    (["rollout.cores=0-"], r"^config\.rollout\.cores: '0-' is not a cpu list like '0-3,8'"),
    (["distributed.num_processes=2", "distributed.process_id=0", "distributed.coordinator=h:1"],
     r"^config\.sft\.steps: the cold start through the harness runs in one process"),
    (["model.init=smollm2-13m"], r"^config\.model\.init: 'smollm2-13m' is neither a preset nor a directory with "
                                 r"config\.json; did you mean smollm2-135m\?$"),
    (["model.overrides.d_modle=32"], r"^config\.model\.overrides\.d_modle: not a field of ModelConfig; did you mean "
                                     r"d_model\?$"),
    (["learner.lr=-1"], r"^config\.learner\.lr: must be > 0, got -1\.0$"),
])
def test_bad_keys_types_and_names_are_one_line_errors(overrides, message):
  with pytest.raises(ConfigError, match=message) as err:
    train_config(_load(QUICKSTART).get_config(), overrides)
  assert "\n" not in str(err.value)


def test_bad_field_in_a_file_names_its_path():
  c = _load(QUICKSTART).get_config().to_dict()
  c["rollout"]["harness"]["max_turn"] = 3
  with pytest.raises(ConfigError, match=r"config\.rollout\.harness\.max_turn: unknown field; did you mean "
                                        r"rollout\.harness\.max_turns"):
    train_config(c)
  c = _load(QUICKSTART).get_config().to_dict()
  c["learner"]["temperature"] = 0.7
  with pytest.raises(ConfigError, match=r"config\.learner\.temperature"):
    train_config(c)


def test_tuple_and_none_forms():
  base = _load(QUICKSTART).get_config()
  wide = ["shim.max_context=8192", "engine.options.max_seq_len=8192"]  # (room for OpenClaw's own prompt)
  assert train_config(base, ["harnesses=mini,openclaw", *wide]).harnesses == ("mini", "openclaw")
  assert train_config(base, ["harnesses=('openclaw', 'mini')", *wide]).harnesses == ("openclaw", "mini")
  assert train_config(base, ["task_ids="]).task_ids == ()
  assert train_config(base, ["learner.grad_clip=None"]).learner.grad_clip is None


def test_a_loss_from_a_module_outside_the_package_trains(tmp_path, monkeypatch):
  (tmp_path / "my_losses.py").write_text(
      "import jax.numpy as jnp\n"
      "from clawjax.rl.losses import LossTerms, register_loss\n\n"
      "@register_loss('outside_reinforce')\n"
      "def reinforce(x, cfg):\n"
      "  return LossTerms(policy=-x.advantages * x.logp)\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(LOSSES, "outside_reinforce", raising=False)
  with pytest.raises(ConfigError, match="outside_reinforce"):
    train_config(_load(QUICKSTART).get_config(), ["learner.loss=outside_reinforce"])
  cfg = train_config(_load(QUICKSTART).get_config(), ["plugins=my_losses", "learner.loss=outside_reinforce"])
  assert cfg.learner.loss == "outside_reinforce" and "outside_reinforce" in LOSSES

  rng = np.random.default_rng(0)
  batch = tree_layout([random_tree(rng, 40, 256) for _ in range(2)], rows=2, length=64)
  learner = Learner(LearnerConfig(loss="outside_reinforce", optimizer="sgd", lr=0.1, logits_chunk=32),
                    make_policy())
  _, grads, metrics = learner.loss_and_grads(batch)
  before = jax.device_get(learner.state.params["policy"])
  learner.step(batch)
  after = jax.device_get(learner.state.params["policy"])
  # SGD on the user's loss: every parameter moved by -lr * its (norm-clipped) gradient.
  scale = 0.1 * min(1.0, 1.0 / metrics["grad_norm"])
  moved = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), after, before)
  want = jax.tree.map(lambda g: -scale * np.asarray(g, np.float64), jax.device_get(grads["policy"]))
  assert metrics["grad_norm"] > 0 and rel_diff(moved, want) < 1e-4


def test_resume_checks_the_config_against_config_json(tmp_path):
  cfg = train_config(_load(QUICKSTART).get_config())
  saved = json.loads(json.dumps(to_json(cfg)))
  check_resume(saved, train_config(_load(QUICKSTART).get_config(), ["steps=40", "progress=false"]))
  changed = train_config(_load(QUICKSTART).get_config(), ["learner.lr=0.5", "seed=3"])
  with pytest.raises(ConfigError, match=r"learner\.lr: 0\.001 -> 0\.5; seed: 0 -> 3.*allow_config_change"):
    check_resume(saved, changed)
  check_resume(saved, train_config(_load(QUICKSTART).get_config(),
                                   ["learner.lr=0.5", "seed=3", "allow_config_change=true"]))


def test_a_rerun_with_another_config_is_refused_before_it_starts(tmp_path):
  cfg = train_config(_load(QUICKSTART).get_config())
  Trainer(cfg, tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(to_json(cfg)))  # the run started (and checkpointed)
  (tmp_path / "checkpoints").mkdir(exist_ok=True)
  with pytest.raises(ConfigError, match=r"learner\.lr"):
    Trainer(train_config(_load(QUICKSTART).get_config(), ["learner.lr=0.5"]), tmp_path)


def test_a_start_that_fails_leaves_the_workdir_to_the_corrected_command(tmp_path):
  broken = tmp_path / "broken_model"  # passes the config's check (it has a config.json), fails to load
  broken.mkdir()
  (broken / "config.json").write_text("{}")
  workdir = tmp_path / "run"
  cfg = train_config(_load(QUICKSTART).get_config(), [f"model.init={broken}", "model.random_init=false"])
  with pytest.raises(ValueError, match=r"config\.json: model_type=None is not supported"):
    Trainer(cfg, workdir).run()
  assert not (workdir / "config.json").exists()
  Trainer(train_config(_load(QUICKSTART).get_config(), ["sft.steps=0"]), workdir)  # not refused


def test_a_resume_may_change_how_rollouts_are_isolated_and_shown(tmp_path):
  saved = json.loads(json.dumps(to_json(train_config(_load(QUICKSTART).get_config()))))
  check_resume(saved, train_config(_load(QUICKSTART).get_config(),
                                   ["rollout.sandbox.mode=none", "rollout.keep_dirs=true", "progress=false"]))
  with pytest.raises(ConfigError, match=r"rollout\.timeout_s: 120\.0 -> 60\.0"):
    check_resume(saved, train_config(_load(QUICKSTART).get_config(), ["rollout.timeout_s=60"]))


def _train_py(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(ROOT / "experiments" / "train.py"), *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_train_py_prints_one_line_errors_and_the_resolved_config(tmp_path):
  bad = _train_py("--config=configs/quickstart.py", "--config.kl_coef=0.1", f"--workdir={tmp_path}")
  assert bad.returncode != 0
  assert bad.stderr.strip().splitlines() == ["error: config.kl_coef: unknown field; did you mean learner.kl_coef?"]
  assert not (tmp_path / "config.json").exists()
  ok = _train_py("--config=configs/quickstart.py", "--config.learner.kl_coef", "0.2",
                 "--config.harnesses=mini,openclaw", "--config.shim.max_context=8192",
                 "--config.engine.options.max_seq_len=8192", "--print_config")
  assert ok.returncode == 0, ok.stderr
  printed = json.loads(ok.stdout)
  assert printed["learner"]["kl_coef"] == 0.2 and printed["harnesses"] == ["mini", "openclaw"]
  assert printed["learner"]["eps_low"] == LearnerConfig().eps_low  # a default the file does not set
