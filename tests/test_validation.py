"""Bad input where a user touches the project: every config field, data files, the command line.

Config errors are raised before anything compiles and name the field; data
problems are a clear error or a counted, logged skip; `main` turns a user's
mistake into one error line and exit status 1, never a traceback.
"""

import logging
import re

import ml_collections
import pytest

import faults
from transformer_jax import data, main, recovery, training
from transformer_jax.data import sources


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
  tree = training.default_config().to_dict()
  for dotted, value in changes.items():
    *parents, leaf = dotted.split("__")
    node = tree
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return ml_collections.ConfigDict(tree)


def test_the_default_config_is_valid():
  training.validate_config(training.default_config())


@pytest.mark.parametrize("field", _leaf_fields(training.default_config()))
def test_every_field_rejects_a_value_of_the_wrong_type_naming_the_field(field):
  with pytest.raises(ValueError, match=re.escape(f"config.{field}")):
    training.validate_config(_with(**{field.replace(".", "__"): ["not", "a", "value"]}))


@pytest.mark.parametrize("changes,message", [
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
    ({"data__vocab_size": 8}, "config.data.vocab_size=8 is invalid: allowed at least 16"),
    # Unknown and missing fields.
    ({"num_train_step": 5}, "config.num_train_step is not a known field"),
    ({"model__layers": 5}, "config.model.layers is not a model field"),
    ({"data__vocab": 5}, "config.data.vocab is not a known field"),
    ({"mesh__pipeline": 2}, r"config.mesh has unknown axes \['pipeline'\]"),
    # Combinations.
    ({"mesh__data": 3}, "config.mesh=.* needs 3 devices but 8 are present"),
    ({"mesh__data": 2, "mesh__fsdp": 2}, "config.mesh=.* needs 4 devices but 8"),
    ({"mesh__tensor": 3}, "the fixed axes use 3 devices, which does not divide the 8"),
    ({"data__batch_multiple": 4, "data__eval_batch_size": 64},
     r"config.data.batch_multiple=4 must be a multiple of 8 = 8 batch shards"),
    ({"grad_accum_steps": 3}, r"must be a multiple of 24 = 8 batch shards .* x "
                              r"config.grad_accum_steps=3"),
    ({"model__d_model": 30}, r"config.model.d_k: d_model=30 is not divisible by num_heads=8"),
    ({"model__num_heads": 7}, r"d_model=512 is not divisible by num_heads=7"),
    ({"model__max_len": 64},
     r"config.data.max_source_length=72 is longer than config.model.max_len=64, the positions"),
    ({"data__batch_mode": "packed", "model__max_len": 100},
     r"config.data.max_length=128 is longer than config.model.max_len=100"),
    ({"data__batch_mode": "packed", "data__max_length": 64},
     r"config.data.max_source_length=72 is invalid: allowed at most data.max_length=64"),
    ({"data__batch_mode": "packed", "data__batch_size": 12},
     r"config.data.batch_size=12 is invalid: allowed a multiple of data.batch_multiple=8"),
    ({"data__source_lang": "de"}, r"config.data.source_lang='de' is invalid: allowed a "
                                  r"language of embedded"),
    ({"sharding_rules": "batch=data,heads=cores"}, "unknown mesh axis 'cores'"),
    ({"sharding_rules": "zero3"}, "config.sharding_rules='zero3' is not understood"),
])
def test_bad_values_and_combinations_name_the_field(changes, message):
  with pytest.raises(ValueError, match=message):
    training.validate_config(_with(**changes))


# Data files.

def _text(tmp_path, source: bytes, target: bytes):
  (tmp_path / "corpus.en").write_bytes(source)
  (tmp_path / "corpus.de").write_bytes(target)
  c = data.default_config()
  c.name, c.source_lang, c.target_lang = "text", "en", "de"
  c.text_train, c.data_dir = str(tmp_path / "corpus"), str(tmp_path / "tfds")
  return c


def test_a_missing_file_names_the_field_and_the_path(tmp_path):
  c = _text(tmp_path, b"a\n", b"b\n")
  c.text_validation = str(tmp_path / "nowhere")
  with pytest.raises(FileNotFoundError, match=r"data.text_validation=.* no file .*nowhere.de"):
    sources.open_split(c, "train")


def test_an_empty_file_is_an_error_naming_it(tmp_path):
  with pytest.raises(ValueError, match=r"corpus.de is empty"):
    sources.open_split(_text(tmp_path, b"a\nb\n", b""), "train")


def test_files_of_different_line_counts_are_an_error_naming_both(tmp_path):
  with pytest.raises(ValueError, match=r"corpus.de has 1 lines but .*corpus.en has 2"):
    sources.open_split(_text(tmp_path, b"a\nb\n", b"x\n"), "train")


def test_lines_not_utf8_or_too_long_are_skipped_counted_and_logged(tmp_path, caplog):
  long_line = b"word " * 20_000  # 100k bytes.
  source = b"one\n\xff\xfe broken\nthree\n" + long_line + b"\nfive\n"
  target = b"eins\nzwei\ndrei\nvier\nf\xc3\xbcnf\n"
  with caplog.at_level(logging.WARNING):
    split = sources.open_split(_text(tmp_path, source, target), "train")
  assert split.pairs(range(len(split))) == [("one", "eins"), ("three", "drei"), ("five", "fünf")]
  assert re.search(r"corpus.de, .*corpus.en: skipped 1 line pairs not UTF-8 \(lines 2\)",
                   caplog.text)
  assert re.search(r"skipped 1 line pairs with a line over 16384 bytes \(lines 4\)", caplog.text)


def test_a_split_left_without_pairs_is_an_error(tmp_path):
  with pytest.raises(ValueError, match=r"corpus.de, .*corpus.en: no usable line pairs"):
    sources.open_split(_text(tmp_path, b"\xff\n", b"x\n"), "train")


# The command line.

@pytest.mark.parametrize("error", [
    ValueError("config.seed must be an integer >= 0; got -1"),
    FileNotFoundError("data.text_train='x': no file x.en"),
    data.DataUnavailableError("wmt14 is not prepared and cannot be downloaded"),
    recovery.UnusableCheckpointsError("none of the 2 checkpoints can be restored"),
    recovery.CheckpointSaveError("could not save the checkpoint of step 4"),
    training.NonFiniteError("3 updates in a row had a non-finite loss"),
])
def test_main_turns_a_user_error_into_one_line_and_status_1(error):
  def fail():
    raise error
  with pytest.raises(SystemExit) as exit_info:
    main.reports_user_errors(fail)()
  assert exit_info.value.code == f"error: {error}"  # Printed to stderr; the status is 1.


def test_a_bug_still_shows_its_traceback():
  def fail():
    raise KeyError("a bug")
  with pytest.raises(KeyError):
    main.reports_user_errors(fail)()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  return faults.shared_dir(tmp_path_factory)


def test_the_command_line_shows_one_error_line_for_each_user_mistake(shared, tmp_path):
  (tmp_path / "uneven.en").write_text("a\nb\n")
  (tmp_path / "uneven.de").write_text("x\n")
  broken = tmp_path / "broken" / "checkpoints" / "5"
  broken.mkdir(parents=True)
  (broken / "state").write_text("junk")
  text = {"data__name": "text", "data__source_lang": "en", "data__target_lang": "de",
          "data__vocab_path": tmp_path / "text.model"}
  cases = {
      "config.model.d_k: d_model=32 is not divisible by num_heads=5": {"model__num_heads": 5},
      "data.text_train=": {**text, "data__text_train": tmp_path / "missing"},
      "uneven.de has 1 lines but": {**text, "data__text_train": tmp_path / "uneven"},
      "--config.on_bad_checkpoints=start_over": {"workdir": tmp_path / "broken"},
  }
  runs = {}
  for number, (message, overrides) in enumerate(cases.items()):
    workdir = overrides.pop("workdir", tmp_path / str(number))
    runs[message] = faults.Run(shared, workdir, **overrides)
  for message, run in runs.items():
    assert run.finish(timeout=300) == 1, run.output[-3000:]
    errors = [line for line in run.lines if line.startswith("error: ")]
    assert len(errors) == 1 and message in errors[0], (message, run.output[-3000:])
    assert "Traceback" not in run.output and "compiling" not in run.output, run.output[-3000:]
