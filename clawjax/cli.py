"""The experiment scripts' command line (absl): `--config=FILE[:ARG]` plus `--config.a.b=v` overrides resolved
into the run's typed config (clawjax/config.py), `--print_config`, `--workdir`, and a configuration mistake
(no --config, a missing or failing config file, a bad key or value) ending the script with one
`error: ...` line and a non-zero status. A script's main is flags -> config -> library call:

  _FLAGS = cli.define_flags("configs/*.py", "run directory (checkpoints, logs, metrics)")

  def main(args: cli.Args) -> None:
    with cli.exit_on_errors():
      cfg, workdir = _FLAGS.resolve(args, train_config)
      summary = train(cfg, workdir)

  if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from clawjax.jax_import import import_jax

import_jax()  # before anything else imports it: see clawjax/jax_import.py

from absl import app, flags  # pylint: disable=wrong-import-position

from clawjax import config as config_lib  # pylint: disable=wrong-import-position

T = TypeVar("T")


@dataclasses.dataclass
class Args:
  """What `parse_flags` hands to `main`: the positional arguments and the `--config.` overrides."""
  argv: list[str]
  overrides: list[str]


def _split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """argv -> (argv without `--config.a.b=v` / `--config.a.b v`, the overrides as "a.b=v")."""
  rest, overrides = list(argv[:1]), []
  items = iter(argv[1:])
  for arg in items:
    if arg.startswith("--config."):
      item = arg[len("--config."):]
      if "=" not in item:
        item += "=" + next(items, "")
      overrides.append(item)
    else:
      rest.append(arg)
  return rest, overrides


def parse_flags(argv: list[str]) -> Args:
  """absl `flags_parser`: takes out the `--config.` overrides, then parses the rest with absl (its usual
  errors and --help)."""
  rest, overrides = _split_overrides(argv)
  return Args(app.parse_flags_with_usage(rest), overrides)


@dataclasses.dataclass(frozen=True)
class ScriptFlags:
  """The flags every experiment script defines (`define_flags`)."""
  config: flags.FlagHolder
  workdir: flags.FlagHolder | None  # None: the script writes nothing (experiments/compile.py)
  print_config: flags.FlagHolder
  config_files: str  # what --config takes, e.g. "configs/*.py"

  def resolve(self, args: Args, make_config: Callable[[Any, Sequence[str]], T]) -> tuple[T, str | None]:
    """(the typed config `make_config` builds from the file's ConfigDict and the overrides, the workdir).
    With --print_config, prints the config as JSON and exits; without --workdir, exits with an error line.
    A ConfigError propagates (see `exit_on_errors`)."""
    if not self.config.value:
      raise config_lib.ConfigError(f"--config is required: a config file ({self.config_files}); --help says more")
    cfg = make_config(config_lib.load_config_file(self.config.value), args.overrides)
    if self.print_config.value:
      print(json.dumps(config_lib.to_json(cfg), indent=2))
      sys.exit(0)
    if self.workdir is None:
      return cfg, None
    if not self.workdir.value:
      sys.exit("error: --workdir is required")
    return cfg, self.workdir.value


def define_flags(config_files: str, workdir_help: str | None) -> ScriptFlags:
  """Defines --config (a file such as `config_files`), --workdir (unless `workdir_help` is None) and
  --print_config as the calling script's own flags (its --help lists them); call at import."""
  main = sys.argv[0]  # absl's --help lists the flags of the module named so
  config = flags.DEFINE_string(
      "config", None, f"config file ({config_files}), FILE:ARG passes ARG to its get_config; set any field of "
      "the config with --config.a.b=v (--print_config lists every field)", module_name=main)
  workdir = None if workdir_help is None else flags.DEFINE_string("workdir", None, workdir_help, module_name=main)
  print_config = flags.DEFINE_bool(
      "print_config", False, "print every field of the resolved config (what --config.a.b=v can set) as JSON "
      "and exit", module_name=main)
  return ScriptFlags(config=config, workdir=workdir, print_config=print_config, config_files=config_files)


@contextlib.contextmanager
def exit_on_errors(*errors: type[Exception]) -> Iterator[None]:
  """Ends the script with one `error: ...` line on stderr and status 1 on a ConfigError or one of `errors`
  (the run's own bad-input errors), raised by the config or by the run itself (a resume's config.json)."""
  try:
    yield
  except (config_lib.ConfigError, *errors) as e:
    sys.exit(f"error: {e}")
