"""Where a training run's time goes (`RunTimes`): each train-step program's compile time, the
first step's end, and the phases, from `fit` and from `experiment.train`."""

import logging
import re

import pytest

import helpers
from transformer_jax import experiment as experiment_lib
from transformer_jax.train import run_times
from transformer_jax.workdir import Workdir


@pytest.mark.slow
def test_fit_times_each_program_and_the_first_step(tmp_path, caplog):
  trainer = helpers.make_trainer()
  # Three batch shapes, the second one twice: three programs, at steps 1, 2 and 4.
  batches = [
    helpers.synthetic_batch(0, length=12),
    helpers.synthetic_batch(1, length=16),
    helpers.synthetic_batch(2, length=16),
    helpers.synthetic_batch(3, rows=16, length=12),
  ]
  times = run_times.RunTimes()
  with caplog.at_level(logging.INFO, logger="transformer_jax.train"):
    helpers.fit_batches(trainer, batches, tmp_path, times=times, checkpoint_every_steps=100)
  assert [p["step"] for p in times.programs] == [1, 2, 4]
  assert [p["shape"] for p in times.programs] == ["(8, 12)", "(8, 16)", "(16, 12)"]
  assert all(p["seconds"] > 0 for p in times.programs)
  assert times.phases["compiling"] == pytest.approx(sum(p["seconds"] for p in times.programs))
  assert set(times.phases) == {
    "training",
    "compiling",
    "checkpointing",
    "evaluating",
    "waiting_for_data",
  }
  assert times.phases["training"] > 0 and times.phases["checkpointing"] > 0
  assert times.phases["evaluating"] == 0
  # The first step ends after its program is compiled; from the RunTimes' start, as fit was called.
  assert times.first_step > times.programs[0]["seconds"]
  assert times.first_step < sum(times.phases.values())
  text = caplog.text
  assert "step 4: the train step for batch shape (16, 12) took" in text
  assert f"the first step ended {times.first_step:.1f} s after the run's start" in text
  record = times.to_json()
  assert set(record) == {
    "preparing_data",
    "setting_up",
    "first_step",
    "programs",
    "phases",
    "steps",
    "target_tokens",
  }
  real = sum(int((b["targets_segmentation"] > 0).sum()) for b in batches)
  assert (times.steps, times.target_tokens) == (4, real)


@pytest.mark.slow
def test_the_time_a_step_waits_for_its_batch_is_not_training(tmp_path, caplog):
  trainer = helpers.make_trainer()
  batches = [helpers.synthetic_batch(seed) for seed in range(4)]
  times = run_times.RunTimes()
  with caplog.at_level(logging.INFO, logger="transformer_jax.train"):
    helpers.fit_batches(trainer, batches, tmp_path, times=times, data_delay=0.25)
  assert times.phases["waiting_for_data"] >= 4 * 0.25
  assert re.search(r"evaluating 0\.0 s, waiting for data [1-9][0-9.]* s", caplog.text)
  quick = run_times.RunTimes()
  helpers.fit_batches(trainer, batches, tmp_path / "quick", times=quick)
  assert quick.phases["waiting_for_data"] < 4 * 0.25 / 2


@pytest.mark.slow
def test_a_run_stopped_between_log_steps_counts_every_step_and_token(tmp_path):
  trainer = helpers.make_trainer()
  batches = [helpers.synthetic_batch(seed) for seed in range(5)]
  times = run_times.RunTimes()
  helpers.fit_batches(
    trainer,
    batches,
    tmp_path,
    times=times,
    stop_requested=lambda step: step == 3,  # As on SIGTERM: a checkpoint, then the end.
    log_every_steps=2,
    checkpoint_every_steps=100,
  )
  real = sum(int((b["targets_segmentation"] > 0).sum()) for b in batches[:3])
  assert (times.steps, times.target_tokens) == (3, real)  # Step 3 was not a log step.


@pytest.mark.slow
def test_train_splits_the_run_into_data_set_up_compiling_and_training(shared, tmp_path):
  experiment = helpers.tiny_experiment(shared, num_train_steps=3, checkpoint_every_steps=3)
  times = experiment_lib.RunTimes()
  experiment_lib.train(experiment, Workdir(str(tmp_path / "run")), times=times)
  assert times.preparing_data > 0 and times.setting_up > 0
  assert [p["step"] for p in times.programs] == [1]  # Packed batches: one shape.
  # From train()'s start: the data, the set-up, the program, then the step itself.
  assert times.first_step > times.preparing_data + times.setting_up + times.programs[0]["seconds"]
  assert times.phases["training"] > 0 and times.phases["checkpointing"] > 0
