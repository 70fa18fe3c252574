"""End to end through the command line, on tiny runs (`helpers.Run`); and what a user sees when
something goes wrong: one `error:` line for their mistakes, a traceback for a bug.

Losses are read back from the TensorBoard event files a run writes.
"""

import os
import re
import signal
import sys

import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

import helpers
from transformer_jax import compilation_cache, data, main
from transformer_jax import config as config_lib
from transformer_jax.checkpoints import recovery, store
from transformer_jax.cli import flag_errors
from transformer_jax.errors import FieldError, UserError
from transformer_jax.train.loop import NonFiniteError


def _run(shared, workdir, *extra, **overrides):
  """A tiny run that checkpoints only at the end (the default experiment's every 50 steps)."""
  return helpers.Run(
    shared, workdir, *extra, **{"checkpoint_every_steps": 50, "keep_checkpoints": 5, **overrides}
  )


@pytest.mark.slow
@pytest.mark.device
def test_the_default_experiment_learns(shared, tmp_path):
  output = _run(
    shared, tmp_path, num_train_steps=40, learning_rate=2.0, eval_every_steps=40
  ).succeed()
  losses = helpers.scalars(tmp_path, "train/loss")
  assert sorted(losses) == list(range(1, 41))
  # From above log(vocab) at the start to well below it (the unigram level) in 40 steps.
  first, last = losses[1], np.mean([losses[s] for s in range(36, 41)])
  assert first > np.log(200) and last < first - 0.8, (first, last)
  assert set(helpers.scalars(tmp_path, "eval_validation/perplexity")) == {40}
  assert "ETA" in output and "MFU" in output and "done: step 40/40" in output
  phases = re.search(
    r"training ([\d.]+) s, compiling ([\d.]+) s, checkpointing ([\d.]+) s, "
    r"evaluating ([\d.]+) s",
    output,
  )
  assert phases, output[-2000:]
  training, compiling, checkpointing, evaluating = map(float, phases.groups())
  assert min(compiling, evaluating) > 0 and training >= 0 and checkpointing >= 0, output[-2000:]
  assert re.search(r"set-up took [\d.]+ s: the vocabulary and the data [\d.]+ s", output)
  assert re.search(r"step 1: the train step for batch shape .* took [\d.]+ s to compile", output)
  assert re.search(r"the first step ended [\d.]+ s after the run's start", output)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["40"]
  # The terminal shows progress, not the config (it is in the work directory).
  assert "num_train_steps: 40" in (tmp_path / "config.txt").read_text()
  assert "adam_b1" not in output and "Unable to initialize backend" not in output


@pytest.mark.slow
def test_several_modes_run_in_order_in_one_process(shared, tmp_path):
  output = _run(
    shared,
    tmp_path,
    "--mode=train,average,eval",
    "--checkpoint=averaged",
    num_train_steps=4,
    checkpoint_every_steps=2,
    average_last=2,
  ).succeed()
  took = re.findall(r"--mode=(\w+) took [\d.]+ s", output)
  assert took == ["train", "average", "eval"], output[-3000:]
  assert "averaged steps 2, 4 into" in output and re.search(r"test BLEU [\d.]+ .*averaged", output)
  assert len(re.findall(r"compilation cache .*programs", output)) == 1


def test_a_mode_that_does_not_exist_is_named_with_the_modes_there_are():
  with pytest.raises(
    flags.ValidationError,
    match=re.escape(
      "'evaluate' is not a mode; --mode takes one or more of train, average, eval, translate, "
      "compile, comma-separated"
    ),
  ):
    main._known_modes(["train", "evaluate"])
  assert main._known_modes(["train", "average", "eval"])
  # And it is what checks --mode when the flags are parsed.
  assert [v.checker for v in flags.FLAGS["mode"].validators] == [main._known_modes]


def test_an_override_with_nothing_after_the_equals_sign_is_an_empty_setting(tmp_path, monkeypatch):
  """`--config.compilation_cache_dir=` on the command line turns the compilation cache off."""
  argv = [
    "main",
    f"--config={helpers.REPO / 'experiments' / 'default.py'}",
    f"--workdir={tmp_path}",
    "--config.compilation_cache_dir=",
  ]
  monkeypatch.setattr(sys, "argv", argv)  # Where ml_collections finds the overrides to define.
  with flagsaver.flagsaver():
    flag_errors.parse_flags(argv)
    experiment = config_lib.parse(flags.FLAGS["config"].value)
  assert experiment.compilation_cache_dir == ""
  assert compilation_cache.directory(experiment.compilation_cache_dir) is None


@pytest.mark.slow
def test_three_steps_then_a_restart_equal_six_straight(shared, tmp_path):
  straight, split = tmp_path / "straight", tmp_path / "split"
  runs = [_run(shared, straight, num_train_steps=6), _run(shared, split, num_train_steps=3)]
  for run in runs:
    run.succeed()
  output = _run(shared, split, num_train_steps=6).succeed()
  assert "resumed from" in output and "at step 3" in output
  straight_losses, split_losses = (helpers.scalars(d, "train/loss") for d in (straight, split))
  assert sorted(straight_losses) == sorted(split_losses) == list(range(1, 7))
  for step in range(1, 7):
    assert split_losses[step] == straight_losses[step], step
  a, b = helpers.restore_state(straight, 6), helpers.restore_state(split, 6)
  assert int(a["step"]) == int(b["step"]) == 6
  for x, y in zip(helpers.leaves(a), helpers.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_modes_after_training_do_not_run(shared, tmp_path):
  """(SIGTERM to a run of training alone: tests/test_faults_runs.py.)"""
  run = _run(
    shared,
    tmp_path,
    "--mode=train,average,eval",
    num_train_steps=100000,
    checkpoint_every_steps=100000,
  )
  run.wait_for(r"step 3/100000")
  run.process.send_signal(signal.SIGTERM)
  output = run.succeed()
  assert "stopped at step" in output
  steps = [int(s) for s in os.listdir(tmp_path / "checkpoints")]
  assert len(steps) == 1 and 3 <= steps[0] < 100000
  assert "not running --mode=average,eval" in output
  assert not (tmp_path / "averaged").exists() and "BLEU" not in output


@pytest.mark.parametrize(
  "error",
  [
    config_lib.ConfigError("--config=x.py: there is no file x.py"),
    FieldError("", "seed", " must be an integer >= 0; got -1"),
    FieldError("data", "text_train", "='x': no file x.en"),
    data.DataError("x.de has 1 lines but x.en has 2"),
    data.DataUnavailableError("wmt14 is not prepared and cannot be downloaded"),
    store.CheckpointMismatchError("checkpoint 5 does not fit the model"),
    recovery.UnusableCheckpointsError("none of the 2 checkpoints can be restored"),
    recovery.CheckpointSaveError("could not save the checkpoint of step 4"),
    NonFiniteError("3 updates in a row had a non-finite loss"),
    UserError("no checkpoint in /tmp/x"),
  ],
)
def test_main_turns_a_user_error_into_one_line_and_status_1(error):
  def fail():
    raise error

  with pytest.raises(SystemExit) as exit_info:
    main.reports_user_errors(fail)()
  prefix = "config." if isinstance(error, FieldError) else ""  # Named as the flags name it.
  assert exit_info.value.code == f"error: {prefix}{error}"  # Printed to stderr; status 1.


@pytest.mark.parametrize(
  "error", [KeyError("a bug"), ValueError("a bug inside JAX"), OSError("a bug in a library")]
)
def test_any_other_error_keeps_its_traceback(error):
  def fail():
    raise error

  with pytest.raises(type(error)):
    main.reports_user_errors(fail)()


_FAILING_MAIN = """
import sys
from absl import app
from transformer_jax import errors, experiment, main

def fail(settings, workdir, description):
  raise {error}

experiment.train = fail
app.run(main.main)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
  "error, user_error",
  [("ValueError('a bug inside JAX')", False), ("errors.UserError('a user mistake')", True)],
)
def test_through_the_command_line_a_bug_shows_its_traceback_and_a_mistake_one_line(
  shared, tmp_path, error, user_error
):
  result = helpers.python(
    "-c",
    _FAILING_MAIN.format(error=error),
    "--config=experiments/default.py",
    f"--workdir={tmp_path}",
    shared=shared,
    timeout=120,
  )
  assert result.returncode == 1, result.stderr[-3000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  if user_error:
    assert errors == ["error: a user mistake"] and "Traceback" not in result.stderr
  else:
    assert not errors and "Traceback" in result.stderr, result.stderr[-3000:]
    assert result.stderr.rstrip().endswith("ValueError: a bug inside JAX")
