"""Config files parsed into an `Experiment`: every field checked before anything compiles, errors
naming the field as the command line does.

The references are hand-written: each field's allowed values, and the
messages a user reads.
"""

import dataclasses
import re

import jax
import ml_collections
import pytest

from tools import config_reference
from transformer_jax import config as config_lib
from transformer_jax import schema
from transformer_jax.cli import flag_errors
from transformer_jax.data import DataConfig
from transformer_jax.errors import FieldError, UserError
from transformer_jax.experiment import Experiment
from transformer_jax.model.transformer import TransformerConfig


def _leaf_fields(config, prefix="") -> list[str]:
  """Dotted names of every leaf field of a config."""
  names = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      names += _leaf_fields(value, f"{prefix}{key}.")
    else:
      names.append(f"{prefix}{key}")
  return names


def _with(**changes) -> ml_collections.ConfigDict:
  """The default config with `changes` (`a__b` for `a.b`), of any type (no type checks)."""
  tree = config_lib.default_config().to_dict()
  for dotted, value in changes.items():
    *parents, leaf = dotted.split("__")
    node = tree
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return ml_collections.ConfigDict(tree)


def _problem(config: ml_collections.ConfigDict, num_devices: int = 8) -> str:
  """What the command line says of `config` on `num_devices` devices (parsed, then checked against
  them)."""
  with pytest.raises(UserError) as caught:
    config_lib.parse(config).check_devices(num_devices)
  return config_lib.user_message(caught.value)


def test_the_default_config_is_valid_and_parses_to_the_default_experiment():
  experiment = config_lib.parse(config_lib.default_config())
  experiment.check_devices(8)
  assert experiment == Experiment()


@pytest.mark.parametrize("field", _leaf_fields(config_lib.default_config()))
def test_every_field_rejects_a_value_of_the_wrong_type_naming_the_field(field):
  assert f"config.{field}" in _problem(_with(**{field.replace(".", "__"): ["not", "a", "value"]}))


@pytest.mark.parametrize(
  "changes,message",
  [
    # Ranges.
    ({"num_train_steps": 0}, "config.num_train_steps must be a positive integer; got 0"),
    ({"learning_rate": -1.0}, "config.learning_rate must be a number > 0"),
    ({"adam_b2": 1.0}, r"config.adam_b2 must be a number in \[0, 1\)"),
    ({"label_smoothing": True}, "config.label_smoothing must be a number"),
    ({"label_smoothing": 1.0}, r"config.label_smoothing must be a number in \[0, 1\)"),
    ({"grad_accum_steps": 2.5}, "config.grad_accum_steps must be a positive integer"),
    ({"max_consecutive_nonfinite_steps": 0}, "config.max_consecutive_nonfinite_steps must be"),
    ({"on_checkpoint_save_error": "retry"}, "config.on_checkpoint_save_error must be 'stop' or"),
    ({"on_bad_checkpoints": "ignore"}, "config.on_bad_checkpoints must be 'stop' or 'start_over'"),
    ({"preemption_grace_seconds": -5}, "config.preemption_grace_seconds must be a number >= 0"),
    ({"model__dropout_rate": 1.5}, r"config.model.dropout_rate must be a number in \[0, 1\)"),
    ({"data__vocab__size": 8}, "config.data.vocab.size must be an integer >= 16; got 8"),
    ({"decode__early_stopping": "never"}, "config.decode.early_stopping must be 'exact' or"),
    ({"mesh__data": -1, "mesh__fsdp": -1}, "config.mesh: at most one axis may be -1"),
    # Unknown and missing fields.
    ({"num_train_step": 5}, "config.num_train_step is not a known field"),
    ({"model__layers": 5}, "config.model.layers is not a known field; known fields: num_layers"),
    ({"model__vocab_size": 100}, "config.model.vocab_size is not a known field"),
    ({"data__vocabulary": 5}, "config.data.vocabulary is not a known field"),
    ({"data__vocab": 5}, "config.data.vocab must be a section of fields; got 5"),
    ({"mesh__pipeline": 2}, r"config.mesh.pipeline is not a known field"),
    ({"decode": 3}, r"config.decode must be a section of fields; got 3"),
    # Combinations.
    ({"mesh__data": 3}, "config.mesh=.* needs 3 devices but 8 are present"),
    ({"mesh__data": 2, "mesh__fsdp": 2}, "config.mesh=.* needs 4 devices but 8"),
    ({"mesh__tensor": 3}, "the fixed axes use 3 devices, which does not divide the 8"),
    (
      {"data__batch__multiple": 4, "data__batch__eval_size": 64},
      r"config.data.batch.multiple=4 must be a multiple of 8 = 8 batch shards",
    ),
    (
      {"grad_accum_steps": 3},
      r"must be a multiple of 24 = 8 batch shards .* x "
      r"config.grad_accum_steps=3",
    ),
    ({"model__d_model": 30}, r"config.model.d_k: d_model=30 is not divisible by num_heads=8"),
    ({"model__d_model": 31}, r"config.model.d_model must be an even positive integer; got 31"),
    ({"model__num_heads": 7}, r"d_model=512 is not divisible by num_heads=7"),
    (
      {"num_train_steps": 100, "cooldown_steps": 200},
      r"config.cooldown_steps=200 is longer than the run \(num_train_steps=100\)",
    ),
    (
      {"model__max_len": 64},
      r"config.data.batch.max_source_length=72 is longer than config.model.max_len=64, the "
      "positions",
    ),
    (
      {"data__batch__mode": "packed", "model__max_len": 100},
      r"config.data.batch.max_length=128 is longer than config.model.max_len=100",
    ),
    (
      {"data__batch__mode": "packed", "data__batch__max_length": 64},
      r"config.data.batch.max_source_length=72 is invalid: allowed at most "
      "data.batch.max_length=64",
    ),
    (
      {"data__batch__mode": "packed", "data__batch__size": 12},
      r"config.data.batch.size=12 is invalid: allowed a multiple of data.batch.multiple=8",
    ),
    (
      {"data__source__source_lang": "de"},
      r"config.data.source.source_lang='de' is invalid: allowed a "
      r"language of embedded",
    ),
    ({"sharding_rules": "batch=data,heads=cores"}, "unknown mesh axis 'cores'"),
    ({"sharding_rules": "zero3"}, "config.sharding_rules='zero3' is not understood"),
  ],
)
def test_bad_values_and_combinations_name_the_field(changes, message):
  assert re.search(message, _problem(_with(**changes)))


def test_a_missing_field_is_named():
  config = config_lib.default_config()
  del config.decode["beam_size"]
  assert _problem(config) == "config.decode.beam_size is missing"


def test_model_fields_follow_the_presets_and_build_the_model():
  config = config_lib.default_config()
  config.model = config_lib.model_fields("big")
  config.data.vocab.size = 37000
  model = config_lib.parse(config).model
  assert model.vocab_size is None  # The vocabulary sets it when the model is placed.
  assert dataclasses.replace(model, vocab_size=37000) == TransformerConfig.preset("big")
  config.model = config_lib.model_fields("C2", dtype="bfloat16")
  config.data.vocab.size = 100
  c2 = config_lib.parse(config).placement(vocab_size=100, devices=jax.devices()[:1]).model.config
  assert (c2.num_layers, c2.dtype, c2.key_size, c2.vocab_size) == (4, "bfloat16", 64, 100)
  with pytest.raises(ValueError, match="unknown preset 'huge'; allowed: base"):
    config_lib.model_fields("huge")
  with pytest.raises(FieldError, match="model.vocab_size is not a model field"):
    config_lib.model_fields("base", vocab_size=100)
  with pytest.raises(FieldError, match="model.heads is not a model field"):
    config_lib.model_fields("base", heads=4)


def test_every_setting_has_a_help_line_and_the_generated_reference_is_current():
  described = schema.describe(Experiment)
  assert sorted(path for path, *_ in described) == sorted(_leaf_fields(config_lib.default_config()))
  for path, _, allowed, help_ in described:
    assert help_ and allowed, path
  reference = config_reference.PATH.read_text()
  for path, *_ in described:
    assert f"| `{path.rpartition('.')[2]}` |" in reference, path
  assert reference == config_reference.render(), (
    "docs/config.md is stale: python -m tools.config_reference"
  )


def test_a_parameter_that_does_not_split_over_the_mesh_names_the_rules():
  config = config_lib.default_config()
  config.mesh.update(data=4, tensor=2)
  config.sharding_rules = "tp"
  with pytest.raises(FieldError) as caught:
    config_lib.parse(config).placement(vocab_size=41)
  assert re.fullmatch(
    r"config.sharding_rules: \['embed'\]\['embedding'\] has shape \(41, 512\): "
    r"dimension 0 \(41\) cannot be split over mesh axes \('tensor',\) "
    r"\(2 shards\).*",
    config_lib.user_message(caught.value),
  )


@pytest.mark.parametrize("old,new", sorted(DataConfig.MOVED.items()))
def test_a_data_setting_by_its_name_before_the_sections_is_refused_naming_the_new_one(old, new):
  config = config_lib.default_config()
  section, field = new.split(".")
  config.data[old] = config.data[section][field]  # As a config file of before set it.
  assert _problem(config) == f"config.data.{old} is now data.{new}"
  problem = flag_errors.config_flag_problem(
    ["main", "--config=experiments/default.py", f"--config.data.{old}=1"]
  )
  assert problem == f"--config.data.{old} is now --config.data.{new}"


# The config.py that `python -m transformer_jax.pretrained import` wrote into a work directory
# before the data settings had sections.
_IMPORTED_BEFORE = """
from transformer_jax import config as config_lib


def get_config():
  config = config_lib.default_config()
  config.data.vocab_path = "vocab/marian"
  config.data.vocab_size = 58101
  for field in ("max_source_length", "max_target_length", "max_length"):  # Within the positions.
    config.data[field] = min(config.data[field], 512)
  return config
"""


def test_a_work_directory_s_config_file_of_before_gives_one_line_naming_the_new_field(tmp_path):
  (tmp_path / "config.py").write_text(_IMPORTED_BEFORE)
  problem = flag_errors.config_flag_problem(["main", f"--config={tmp_path}/config.py"])
  assert problem == (
    f"--config={tmp_path}/config.py: KeyError: \"'max_source_length'\" "
    "(data.max_source_length is now data.batch.max_source_length)"
  )
  # Changed as the line says (and the other two it reads, and the two it sets), it runs.
  fixed = _IMPORTED_BEFORE.replace("config.data[", "config.data.batch[")
  fixed = fixed.replace("data.vocab_path", "data.vocab.path")
  (tmp_path / "config.py").write_text(fixed)
  with pytest.raises(UserError, match=r"^data.vocab_size is now data.vocab.size$"):
    config_lib.parse(config_lib.load_file(f"{tmp_path}/config.py"))
  (tmp_path / "config.py").write_text(fixed.replace("data.vocab_size", "data.vocab.size"))
  data = config_lib.parse(config_lib.load_file(f"{tmp_path}/config.py")).data
  assert (data.vocab.path, data.vocab.size, data.batch.max_length) == ("vocab/marian", 58101, 128)


def test_docs_data_md_lists_every_data_setting_that_moved():
  text = (config_reference.PATH.parent / "data.md").read_text()
  for old, new in DataConfig.MOVED.items():
    assert f"| `data.{old}` | `data.{new}` |" in text, old
