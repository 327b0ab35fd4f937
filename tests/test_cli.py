"""The experiment scripts as a newcomer types them: a mistake at the start of a command (no --config, a
missing config file, a bad argument to one, a model name or key that does not exist, a meaningless
number) ends it with one `error: ...` line and status 1 before anything is written, and --help lists the
script's own flags and points at --print_config for the config's fields."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_SCRIPTS = ("train", "sft", "eval", "compile")  # the scripts that take --config


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, f"experiments/{name}.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _error_line(out: subprocess.CompletedProcess) -> str:
  """The one line a refused command prints (it must print no other)."""
  assert out.returncode == 1, (out.returncode, out.stderr[-2000:])
  [line] = out.stderr.strip().splitlines()
  return line


@pytest.mark.parametrize("script", CONFIG_SCRIPTS)
def test_no_config_is_one_line(script, tmp_path):
  args = [] if script == "compile" else [f"--workdir={tmp_path / 'run'}"]
  assert _error_line(_script(script, *args)).startswith("error: --config is required: a config file (configs/")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", CONFIG_SCRIPTS)
def test_help_lists_the_flags_and_points_at_print_config(script):
  out = _script(script, "--help")  # (absl ends --help with status 1)
  flags = out.stdout[out.stdout.index(f"experiments/{script}.py:"):]
  assert "--config: config file" in flags and "--[no]print_config: print every field" in flags
  assert "--config.a.b=v (--print_config lists every" in " ".join(flags.split())


def test_a_missing_config_file_is_one_line(tmp_path):
  line = _error_line(_script("train", "--config=configs/quickstrat.py", f"--workdir={tmp_path}"))
  assert line == ("error: --config=configs/quickstrat.py: no such file; "
                  "did you mean configs/quickstart.py, configs/quickstart_moe.py?")


def test_a_bad_argument_to_a_config_file_is_one_line(tmp_path):
  line = _error_line(_script("eval", "--config=configs/eval/clawgym_bench.py:pinch", f"--workdir={tmp_path}"))
  assert line == ("error: --config=configs/eval/clawgym_bench.py:pinch: the benchmark 'pinch' (after the colon): "
                  "expected one of ['clawgym_bench', 'pinchbench']")


def test_a_model_name_that_does_not_exist_is_refused_before_print_config():
  line = _error_line(_script("train", "--config=configs/quickstart.py", "--config.model.init=smollm2-13m",
                             "--print_config"))
  assert line == ("error: config.model.init: 'smollm2-13m' is neither a preset nor a directory with config.json; "
                  "did you mean smollm2-135m?")


def test_a_meaningless_number_is_refused_and_nothing_is_written(tmp_path):
  line = _error_line(_script("sft", "--config=configs/sft/cpu_small.py", "--config.learner.lr=-1",
                             f"--workdir={tmp_path / 'run'}"))
  assert line == "error: config.learner.lr: must be > 0, got -1.0"
  assert not (tmp_path / "run").exists()


def test_plot_and_report_of_a_directory_that_holds_no_run_are_one_line(tmp_path):
  assert _error_line(_script("plot", f"--workdir={tmp_path}")) == f"error: {tmp_path}: no metrics to plot"
  out = _script("report", "--workdir", str(tmp_path / "none"))
  assert _error_line(out) == f"error: {tmp_path / 'none'}: no such run directory"
  assert not (tmp_path / "none").exists()

