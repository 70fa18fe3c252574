"""Mistakes in `--config` and its overrides as one `error:` line, not `ml_collections`' traceback.

absl parses the flags before `main` runs; when that fails, or leaves no config, `parse_flags`
parses the config arguments of argv again to say what is wrong with them.
"""

import difflib
import re
import sys

import ml_collections
from absl import flags

from transformer_jax import config as config_lib
from transformer_jax.errors import UserError


def _config_arguments(argv: list[str]) -> tuple[str | None, list[str]]:
  """(the value of the last --config, the field paths of its --config.<path> overrides)."""
  spec, overrides = None, []
  for i, arg in enumerate(argv[1:], 1):
    if match := re.fullmatch(r"--?config(?:=(.*))?", arg, re.DOTALL):
      spec = match[1] if match[1] is not None else (argv[i + 1] if i + 1 < len(argv) else "")
    elif match := re.match(r"--?(?:no)?config\.([^=]*)", arg):
      overrides.append(match[1])
  return spec, overrides


def _field_paths(config, prefix: str = "") -> list[str]:
  """The dotted paths of every field and section of `config`."""
  paths = []
  for name, value in config.items():
    paths.append(prefix + name)
    if isinstance(value, ml_collections.ConfigDict):
      paths += _field_paths(value, f"{prefix}{name}.")
  return paths


def _check_override(config: ml_collections.ConfigDict, path: str) -> None:
  """UserError unless the override `--config.<path>` names a field of `config`; it names the
  closest known field."""
  if new := config_lib.moved_fields().get(path):
    raise UserError(f"--config.{path} is now --config.{new}")
  parts, node = path.split("."), config
  for depth, part in enumerate(parts):
    holder = ".".join(["config", *parts[:depth]])
    if not isinstance(node, ml_collections.ConfigDict):
      raise UserError(f"--config.{path}: {holder} is a value, not a section of fields")
    if part not in node:
      known = _field_paths(config)
      close = difflib.get_close_matches(path, known, n=1) or [
        p
        for p in known
        if p.rsplit(".", 1)[-1]
        in difflib.get_close_matches(parts[-1], [k.rsplit(".", 1)[-1] for k in known], 1)
      ]
      hint = f"did you mean --config.{close[0]}?" if close else f"its fields: {', '.join(node)}"
      raise UserError(f"--config.{path}: {holder} has no field {part!r}; {hint}")
    node = node[part]


def config_flag_problem(argv: list[str]) -> str | None:
  """What is wrong with `--config` and its overrides in `argv` (a missing or broken config file,
  a variant it does not take, an unknown field), or None."""
  spec, overrides = _config_arguments(argv)
  if spec is None:
    return None
  try:
    config = config_lib.load_file(spec)
    for path in overrides:
      _check_override(config, path)
  except UserError as error:
    return str(error)
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, where a mistake in the flags or the config file ends the program with
  one `error:` line (status 1) instead of what `ml_collections` raises (a traceback, or an
  object that fails later); the arguments left for `main`."""
  try:
    remaining = flags.FLAGS(argv)
  except Exception as error:  # pylint: disable=broad-except  # ml_collections: KeyError, ...
    problem = config_flag_problem(argv)
    if problem is None and not isinstance(error, flags.Error):
      raise
    sys.exit(f"error: {problem or str(error).splitlines()[0]}")
  if not isinstance(flags.FLAGS["config"].value, ml_collections.ConfigDict):  # Failed to load.
    sys.exit(f"error: {config_flag_problem(argv) or '--config gave no ConfigDict'}")
  return remaining
