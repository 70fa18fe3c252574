"""The experiment config: every field declared once (default, check, help), and its validation.

An experiment is an `ml_collections.ConfigDict` with the fields of `FIELDS`
and four sections: `model` (every `TransformerConfig` field but `vocab_size`,
which the vocabulary sets), `data` (`transformer_jax.data.config`), `decode`
(`DECODE_FIELDS`) and `mesh` (`data`, `fsdp`, `tensor` sizes). `validate`
checks all of it before anything compiles and raises ConfigError naming the
field as `config.<section>.<field>`; this module is the one place where
errors of the libraries (`FieldError`) get that name.
"""

from collections.abc import Callable, Mapping
import contextlib
import dataclasses
import glob
import importlib.machinery
import importlib.util
import inspect
import os
from typing import Any

import jax
import ml_collections
from ml_collections import config_dict

from transformer_jax import sharding
from transformer_jax.data import config as data_config
from transformer_jax.errors import FieldError, UserError
from transformer_jax.model.transformer import TransformerConfig, preset_fields


class ConfigError(UserError, ValueError):
  """An experiment config field with a value that is unknown, missing or not allowed."""


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its default, what it allows (`check`, described by `allowed`), its help."""

  default: Any
  allowed: str
  check: Callable[[Any], bool]
  help: str


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(default: int, help_: str, *, minimum: int = 1, zero: str = "") -> Field:
  """An integer field: positive, or >= 0 with `minimum=0` (`zero` says what 0 means)."""
  if minimum:
    allowed = "a positive integer"
  else:
    allowed = f"an integer >= 0 (0 = {zero})" if zero else "an integer >= 0"
  return Field(default, allowed, lambda v: _is_int(v) and v >= minimum, help_)


def _number(default: float, help_: str, allowed: str, check: Callable[[float], bool]) -> Field:
  return Field(default, allowed, lambda v: _is_number(v) and check(v), help_)


def _choice(default: str, help_: str, *choices: str) -> Field:
  return Field(default, " or ".join(repr(c) for c in choices), lambda v: v in choices, help_)


FIELDS: dict[str, Field] = {
    "seed": _count(0, "parameter initialization, dropout (fold_in(key, step)) and data order",
                   minimum=0),
    "num_train_steps": _count(100_000, "the run stops at this step"),
    "warmup_steps": _count(4000, "warmup of the paper's learning-rate schedule"),
    "learning_rate": _number(1.0, "scale on d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)",
                             "a number > 0", lambda v: v > 0),
    "adam_b1": _number(0.9, "Adam's beta1", "a number in [0, 1)", lambda v: 0 <= v < 1),
    "adam_b2": _number(0.98, "Adam's beta2", "a number in [0, 1)", lambda v: 0 <= v < 1),
    "adam_eps": _number(1e-9, "Adam's epsilon", "a number > 0", lambda v: v > 0),
    "label_smoothing": _number(0.1, "1 - eps on the target, eps / (vocab - 1) on each other token",
                               "a number in [0, 1)", lambda v: 0 <= v < 1),
    "grad_clip_norm": _number(0.0, "global-norm gradient clipping (the paper does not clip)",
                              "a number >= 0 (0 = off)", lambda v: v >= 0),
    "grad_accum_steps": _count(1, "micro-batches per batch, run one after another"),
    "checkpoint_every_steps": _count(1000, "also saved at the last step and on preemption"),
    "keep_checkpoints": _count(20, "the newest K checkpoints are kept, for averaging",
                               minimum=0, zero="keep all"),
    "log_every_steps": _count(100, "a log line and TensorBoard scalars every N steps"),
    "eval_every_steps": _count(0, "validation loss and BLEU every N steps and after the last",
                               minimum=0, zero="never"),
    "eval_bleu_sentences": _count(1000, "validation BLEU on this many sentences at each evaluation",
                                  minimum=0, zero="no BLEU"),
    "eval_bleu_beam_size": Field(1, "a positive integer (1 = greedy)",
                                 lambda v: _is_int(v) and v > 0, "the search of that BLEU"),
    "average_last": _count(5, "--mode=average: the mean of the last K checkpoints (paper: 5 base, "
                           "20 big)"),
    "sharding_rules": Field("dp", "a string (a preset such as 'dp', or pairs like "
                            "'batch=data+fsdp,embed=fsdp')", lambda v: isinstance(v, str),
                            "logical axis names -> mesh axes: dp, fsdp, tp or explicit pairs"),
    "peak_flops_per_device": _number(0.0, "the peak for MFU", "a number >= 0 (0 = measure a "
                                     "square matmul at start-up)", lambda v: v >= 0),
    "max_consecutive_nonfinite_steps": _count(10, "stop after this many skipped (non-finite) "
                                              "updates in a row"),
    "on_checkpoint_save_error": _choice("stop", "a failed save stops the run, or training goes "
                                        "on and saves at the next checkpoint step",
                                        "stop", "continue"),
    "on_bad_checkpoints": _choice("stop", "when no checkpoint restores: stop, or move them aside "
                                  "and train from step 0", "stop", "start_over"),
    "preemption_grace_seconds": _number(120.0, "after SIGTERM, exit this long later at the latest",
                                        "a number >= 0 (0 = no limit)", lambda v: v >= 0),
    "compilation_cache_dir": Field(
        "auto", "a directory, 'auto' or '' (off)", lambda v: isinstance(v, str),
        "compiled programs kept between runs (the CLI's modes share them); auto: "
        "$XDG_CACHE_HOME/transformer_jax/xla, default ~/.cache/transformer_jax/xla"),
    "host_timeout_seconds": Field(
        60, "an integer >= 5", lambda v: _is_int(v) and v >= 5,
        "a process of a multi-process run not heard from for this long is lost: the others stop "
        "naming it; a work directory lock not refreshed for this long is stale"),
}

DECODE_FIELDS: dict[str, Field] = {
    "beam_size": Field(4, "a positive integer (1 = greedy)", lambda v: _is_int(v) and v > 0,
                       "beam size of eval and translate"),
    "alpha": _number(0.6, "exponent of the length penalty: ((5 + len) / 6) ** alpha (gnmt) or "
                     "len ** alpha (length)", "a number >= 0", lambda v: v >= 0),
    "length_normalization": _choice("gnmt", "beam scores are summed log-probabilities over the "
                                    "paper's GNMT penalty, or over len ** alpha as Hugging "
                                    "Face's beam search divides them", "gnmt", "length"),
    "max_extra": _count(50, "output tokens <= source tokens + max_extra (and <= model.max_len)",
                        minimum=0),
    "max_length": Field(0, "0 (no cap) or an integer >= 2",
                        lambda v: _is_int(v) and (v == 0 or v >= 2),
                        "output tokens <= max_length - 1, EOS included, whatever the source "
                        "(Hugging Face's max_length, which counts the decoder's start token)"),
    "force_eos": Field(False, "True or False", lambda v: isinstance(v, bool),
                       "an output that reaches its limit ends with EOS, scored log-probability 0 "
                       "(Hugging Face's forced_eos_token_id)"),
    "early_stopping": _choice("exact", "when a sentence's beam search stops: exact (no beam can "
                              "improve; Hugging Face's early_stopping='never'), heuristic (its "
                              "default, False) or first_k (True)", "exact", "heuristic",
                              "first_k"),
    "renormalize": Field(False, "True or False", lambda v: isinstance(v, bool),
                         "log-probabilities are renormalized over the tokens other than pad "
                         "(Hugging Face's renormalize_logits); off: pad's share is dropped"),
    "batch_size": _count(128, "sentences per decoding batch (rounded up to the batch shards)"),
    "split": Field("test", "a split name such as test", lambda v: isinstance(v, str) and v != "",
                   "the split --mode=eval decodes"),
    "tokenized_bleu": Field(False, "True or False", lambda v: isinstance(v, bool),
                            "--mode=eval also reports the paper's tokenized BLEU"),
}

MESH_DEFAULT = {"data": -1, "fsdp": 1, "tensor": 1}
SECTIONS = ("model", "data", "decode", "mesh")


def model_fields(preset: str = "base", **overrides) -> ml_collections.ConfigDict:
  """`config.model`: every `TransformerConfig` field but `vocab_size`, from the paper's `preset`
  (`base`, `big`, a Table 3 row) and `overrides`. ValueError for an unknown preset."""
  with section("model"):
    fields = preset_fields(preset, **overrides)
  return ml_collections.ConfigDict(
      {name: config_dict.placeholder(int) if value is None else value
       for name, value in fields.items()})


def default_config() -> ml_collections.ConfigDict:
  """Every field an experiment has, with the paper's base training settings."""
  config = ml_collections.ConfigDict()
  config.model = model_fields("base")
  config.data = data_config.default_config()
  for name, field in FIELDS.items():
    config[name] = field.default
  config.decode = ml_collections.ConfigDict(
      {name: field.default for name, field in DECODE_FIELDS.items()})
  config.mesh = ml_collections.ConfigDict(MESH_DEFAULT)
  return config


@contextlib.contextmanager
def section(name: str):
  """Turn a FieldError raised inside (by the library that `config.<name>` configures) into a
  ConfigError naming `config.<name>.<field>`."""
  try:
    yield
  except FieldError as error:
    raise ConfigError(f"config.{name}{error.suffix}") from None


def _check_fields(values: Mapping, fields: Mapping[str, Field], prefix: str,
                  sections: tuple[str, ...] = ()) -> None:
  """ConfigError for the first unknown, missing or invalid field of `values` (`sections` are
  known names checked elsewhere)."""
  known = (*fields, *sections)
  for name in values:
    if name not in known:
      raise ConfigError(f"{prefix}{name} is not a known field; known fields: {', '.join(known)}")
  for name, field in fields.items():
    if name not in values:
      raise ConfigError(f"{prefix}{name} is missing")
    if not field.check(values[name]):
      raise ConfigError(f"{prefix}{name} must be {field.allowed}; got {values[name]!r} "
                        f"({field.help})")


def checked_field(config: ml_collections.ConfigDict, name: str):
  """The top-level field `name` of `config`, checked as `validate` checks it (for what must be
  known before the devices may be touched)."""
  _check_fields({name: config[name]} if name in config else {}, {name: FIELDS[name]}, "config.")
  return config[name]


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Raise ConfigError naming the first unknown, missing or invalid field and what it allows.

  Checks the top-level fields, `config.model` (against `TransformerConfig`),
  `config.data`, `config.decode`, `config.mesh` (against `num_devices`,
  default the devices present), `config.sharding_rules`, and that batches fit
  the model's positions and split evenly over the devices. Compiles nothing.
  """
  _check_fields(config, FIELDS, "config.", SECTIONS)
  for name in SECTIONS:
    if name not in config:
      raise ConfigError(f"config.{name} is missing")
    if not isinstance(config[name], (Mapping, ml_collections.ConfigDict)):
      raise ConfigError(f"config.{name} must be a ConfigDict of fields; got {config[name]!r}")
  _check_fields(config.decode, DECODE_FIELDS, "config.decode.")
  model = transformer_config(config, vocab_size=8)
  with section("data"):
    data_config.validate_config(config.data)
  _check_lengths(config.data, model.max_len)
  with section("mesh"):
    mesh_shape = sharding.resolve_mesh_shape(
        dict(config.mesh), jax.device_count() if num_devices is None else num_devices)
  with section("sharding_rules"):
    rules = sharding.logical_rules(config.sharding_rules)
  shards = sharding.num_batch_shards(dict(zip(sharding.MESH_AXES, mesh_shape)), rules)
  if config.data.batch_multiple % (shards * config.grad_accum_steps):
    raise ConfigError(
        f"config.data.batch_multiple={config.data.batch_multiple} must be a multiple of "
        f"{shards * config.grad_accum_steps} = {shards} batch shards (config.mesh with "
        f"config.sharding_rules) x config.grad_accum_steps={config.grad_accum_steps}, so that "
        "every batch splits evenly")


def _check_lengths(data: ml_collections.ConfigDict, max_len: int) -> None:
  """Training rows must fit the model's positions (`config.model.max_len`)."""
  fields = ("max_length",) if data.batch_mode == "packed" else ("max_source_length",
                                                                  "max_target_length")
  for field in fields:
    if data[field] > max_len:
      raise ConfigError(
          f"config.data.{field}={data[field]} is longer than config.model.max_len={max_len}, "
          "the positions the model has; lower it or raise config.model.max_len")


def transformer_config(config: ml_collections.ConfigDict, *, vocab_size: int) -> TransformerConfig:
  """The model of experiment `config` for a vocabulary of `vocab_size` tokens."""
  with section("model"):
    fields = preset_fields("base", **config.model.to_dict())
    return TransformerConfig(vocab_size=vocab_size, **fields)


def placement(config: ml_collections.ConfigDict, *, vocab_size: int,
              devices=None) -> sharding.Placement:
  """The model of `config` placed on a mesh of `devices` (default: every device), as
  `config.mesh` and `config.sharding_rules` say; ConfigError when a parameter does not split
  over it."""
  model = transformer_config(config, vocab_size=vocab_size)
  with section("mesh"):
    mesh = sharding.make_mesh(dict(config.mesh), devices)
  with section("model"):
    model = sharding.for_platform(model, mesh.devices.flat[0].platform)
  with section("sharding_rules"):
    rules = sharding.logical_rules(config.sharding_rules)
    return sharding.Placement(model, mesh, rules)


def load_file(spec: str) -> ml_collections.ConfigDict:
  """The ConfigDict of experiment file `spec` (`path` or `path:variant`, as `--config` takes it);
  ConfigError saying why there is none."""
  path, *variant = spec.split(":", 1)
  if not os.path.isfile(path):
    folder = os.path.dirname(path) or "."
    files = sorted(glob.glob("*.py", root_dir=folder)) if os.path.isdir(folder) else []
    raise ConfigError(f"--config={spec}: there is no file {path}" +
                    (f" (the config files in {folder}: {', '.join(files)})" if files else ""))
  loader = importlib.machinery.SourceFileLoader("_config_being_checked", path)
  module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
  try:
    loader.exec_module(module)
  except Exception as error:  # pylint: disable=broad-except  # Whatever the user's file raises.
    raise ConfigError(f"--config={spec}: the file does not load: "
                    f"{type(error).__name__}: {error}") from None
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ConfigError(f"--config={spec}: the file has no get_config(); a config file defines "
                    "get_config() (or get_config(variant)) returning an ml_collections.ConfigDict")
  try:
    inspect.signature(get_config).bind(*variant)
  except TypeError:
    raise ConfigError(f"--config={spec}: {path} takes no variant; drop ':{variant[0]}'" if variant
                    else f"--config={spec}: {path} needs a variant: --config={path}:<variant>") \
        from None
  try:
    config = get_config(*variant)
  except Exception as error:  # pylint: disable=broad-except
    raise ConfigError(f"--config={spec}: {type(error).__name__}: {error}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"--config={spec}: get_config() returned {type(config).__name__}, not an "
                    "ml_collections.ConfigDict")
  return config
