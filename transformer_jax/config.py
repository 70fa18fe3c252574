"""Experiment config files: their defaults, and their parsing into a typed `Experiment`.

A config file defines `get_config()` (or `get_config(variant)`) returning an
`ml_collections.ConfigDict` made from `default_config()`: the fields of
`Experiment` (`transformer_jax.experiment`), its sections `model`, `data`,
`decode` and `mesh` as sub-dicts, the fields of its groups (`optimizer`,
`fit`) at the top level. `parse` checks it once and returns the `Experiment`;
the command line names a FieldError of the libraries as `config.<path>`
(`user_message`).
"""

import glob
import importlib.machinery
import importlib.util
import inspect
import os

import ml_collections
from ml_collections import config_dict

from transformer_jax import schema
from transformer_jax.errors import FieldError, UserError
from transformer_jax.experiment import Experiment
from transformer_jax.model.config import preset_fields


class ConfigError(UserError, ValueError):
  """A config file that is missing, does not load, or gives no ConfigDict."""


def _config_dict(values: dict) -> ml_collections.ConfigDict:
  """`values` as a ConfigDict; a None default becomes an integer placeholder (d_k, d_v,
  num_decoder_layers)."""
  return ml_collections.ConfigDict(
    {
      name: _config_dict(value)
      if isinstance(value, dict)
      else config_dict.placeholder(int)
      if value is None
      else value
      for name, value in values.items()
    }
  )


def model_fields(preset: str = "base", **overrides) -> ml_collections.ConfigDict:
  """`config.model`: every `TransformerConfig` field but `vocab_size`, from the paper's `preset`
  (`base`, `big`, a Table 3 row) and `overrides`. ValueError for an unknown preset."""
  return _config_dict(preset_fields(preset, **overrides))


def default_config() -> ml_collections.ConfigDict:
  """Every field an experiment has, with the paper's base training settings."""
  return _config_dict(schema.defaults(Experiment))


def parse(config: ml_collections.ConfigDict) -> Experiment:
  """The `Experiment` of `config`: FieldError naming the first unknown, missing or invalid
  field and what it allows. Touches no device (`Experiment.check_devices` does)."""
  return schema.build(Experiment, config.to_dict())


def moved_fields() -> dict[str, str]:
  """`{old path: new path}` of the settings that moved (`data.vocab_size`: `data.vocab.size`)."""
  return schema.moved(Experiment)


def _described(error: Exception) -> str:
  """`error` in a line: a FieldError by its `--config.` path, anything else with its type; a
  config file reading a setting that moved (a KeyError or AttributeError naming it) is told
  where it went."""
  if isinstance(error, FieldError):
    return user_message(error)
  text = f"{type(error).__name__}: {error}"
  if isinstance(error, (KeyError, AttributeError)):
    name = str(error).strip("\"'")
    moved = [
      f"{old} is now {new}" for old, new in moved_fields().items() if old.endswith("." + name)
    ]
    if moved:
      text += f" ({'; '.join(moved)})"
  return text


def user_message(error: UserError) -> str:
  """The message of `error` for the command line: a FieldError names its `--config.` path."""
  return f"config.{error}" if isinstance(error, FieldError) else str(error)


def load_file(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of experiment file `spec` (`path` or `path:variant`, as `--config` takes it);
  ConfigError saying why there is none."""
  path, *variant = spec.split(":", 1)
  if not os.path.isfile(path):
    folder = os.path.dirname(path) or "."
    files = sorted(glob.glob("*.py", root_dir=folder)) if os.path.isdir(folder) else []
    raise ConfigError(
      f"--config={spec}: there is no file {path}"
      + (f" (the config files in {folder}: {', '.join(files)})" if files else "")
    )
  loader = importlib.machinery.SourceFileLoader("_config_being_checked", path)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  try:
    loader.exec_module(module)
  except Exception as error:  # pylint: disable=broad-except  # Whatever the user's file raises.
    raise ConfigError(f"--config={spec}: the file does not load: {_described(error)}") from None
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ConfigError(
      f"--config={spec}: the file has no get_config(); a config file defines "
      "get_config() (or get_config(variant)) returning an ml_collections.ConfigDict"
    )
  try:
    inspect.signature(get_config).bind(*variant)
  except TypeError:
    raise ConfigError(
      f"--config={spec}: {path} takes no variant; drop ':{variant[0]}'"
      if variant
      else f"--config={spec}: {path} needs a variant: --config={path}:<variant>"
    ) from None
  try:
    config = get_config(*variant)
  except Exception as error:  # pylint: disable=broad-except
    raise ConfigError(f"--config={spec}: {_described(error)}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(
      f"--config={spec}: get_config() returned {type(config).__name__}, not an "
      "ml_collections.ConfigDict"
    )
  return config
