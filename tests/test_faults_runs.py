"""Faults injected into whole runs: SIGKILL, SIGTERM, a full disk, diverging updates.

Each test runs tiny trainings in subprocesses (`helpers.Run`) with a
checkpoint every 2 steps (the last 3 kept) and a loss logged at every step,
and compares, bitwise, every loss that every run logged with the loss of the
same step in one uninterrupted reference run: whatever happened, nothing is
lost but the steps since the last checkpoint, and those are redone exactly.
"""

import os
import random
import re
import resource
import signal
import time

import numpy as np
import pytest

import helpers
from transformer_jax.train.loop import PreemptionWatch

pytestmark = pytest.mark.slow

STEPS = 24
SEED = 20240607  # Of the random kill moments; printed with every failure.


@pytest.fixture(scope="module")
def reference(shared, tmp_path_factory):
  """(workdir, {step: loss}) of an uninterrupted run of STEPS steps that saves no checkpoint
  before its end."""
  workdir = tmp_path_factory.mktemp("reference")
  helpers.Run(shared, workdir, num_train_steps=STEPS, checkpoint_every_steps=STEPS).succeed()
  (losses,) = helpers.scalars_per_run(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  return workdir, losses


def _resumed_at(output: str) -> int:
  match = re.search(r"resumed from \S+ at step (\d+)", output)
  return int(match.group(1)) if match else 0


def _assert_losses_match(workdir, reference_losses):
  """Every loss each run in `workdir` logged equals the reference's at that step; all steps seen."""
  seen = set()
  for number, losses in enumerate(helpers.scalars_per_run(workdir)):
    for step, loss in losses.items():
      assert loss == reference_losses[step], (
        f"run {number}, step {step}: {loss!r} != {reference_losses[step]!r}"
      )
    seen |= set(losses)
  assert seen == set(range(1, STEPS + 1))


def _poll(condition, run, timeout=300) -> None:
  """Wait until `condition()` holds (polled every millisecond) or `run` ended."""
  deadline = time.monotonic() + timeout
  while not condition() and run.process.poll() is None:
    assert time.monotonic() < deadline, run.output[-3000:]
    time.sleep(0.001)


def _leftover(directory, deleting: bool) -> bool:
  """Whether a checkpoint is being written (or an old one deleted) in `directory`."""
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return False
  return any(
    ".orbax-checkpoint-tmp" in name and name.endswith("-deleting") == deleting for name in names
  )


def test_sigkill_at_random_moments_loses_only_the_steps_since_the_last_checkpoint(
  shared, reference, tmp_path
):
  reference_dir, reference_losses = reference
  rng = random.Random(SEED)
  moments = [
    "after a step",
    "during a checkpoint write",
    "during start-up",
    "while an old checkpoint is deleted",
  ]
  report = []
  for moment in moments:
    committed, partial = helpers.committed_steps(tmp_path), helpers.partial_writes(tmp_path)
    run = helpers.Run(shared, tmp_path, num_train_steps=STEPS)
    directory = tmp_path / "checkpoints"
    if moment == "during start-up":  # A random moment before its first step.
      deadline = time.monotonic() + rng.uniform(0.5, 8.0)
      _poll(lambda: time.monotonic() > deadline or helpers.logged_steps(run.output), run)  # noqa: B023
    else:  # Once this run has committed a checkpoint of its own (so that it made progress):
      newest = max(committed, default=0)
      _poll(lambda: max(helpers.committed_steps(tmp_path), default=0) > newest, run)  # noqa: B023
      if moment == "after a step":
        target = min(max(helpers.committed_steps(tmp_path)) + rng.randint(0, 3), STEPS - 1)
        run.wait_for(rf"\] step {target}/")
      else:
        deleting = moment == "while an old checkpoint is deleted"
        _poll(lambda: _leftover(directory, deleting), run)  # noqa: B023
    assert run.process.poll() is None, (moment, report, run.output[-3000:])  # Not ended yet.
    run.process.kill()
    run.finish()
    assert run.process.returncode == -signal.SIGKILL, run.output[-3000:]
    resumed = _resumed_at(run.output)
    done = helpers.logged_steps(run.output)
    if done:  # It got past resuming: from the newest committed step, reporting partial writes.
      assert resumed == (max(committed) if committed else 0), (committed, run.output[-3000:])
      assert all(name in run.output for name in partial), (partial, run.output[-3000:])
    left = helpers.partial_writes(tmp_path)
    report.append(
      f"{moment}: "
      + (
        f"resumed at {resumed}, killed after step {max(done)}"
        if done
        else "killed before its first step"
      )
      + f", committed {helpers.committed_steps(tmp_path)}"
      + (f", a partial write left: {', '.join(left)}" if left else "")
    )
  final = helpers.Run(shared, tmp_path, num_train_steps=STEPS)
  output = final.succeed()
  report.append(f"final run: resumed at {_resumed_at(output)}, finished")
  print("\n".join(report))
  assert f"done: step {STEPS}/{STEPS}" in output, report
  leftovers = " ".join(report)
  assert re.search(r"partial write left: \d+\.orbax-checkpoint-tmp(,|$| )", leftovers), report
  assert re.search(r"partial write left: \d+\.orbax-checkpoint-tmp-deleting", leftovers), report
  _assert_losses_match(tmp_path, reference_losses)
  assert helpers.committed_steps(tmp_path)[-1] == STEPS
  ours, theirs = (helpers.restore_state(d, STEPS) for d in (tmp_path, reference_dir))
  assert int(ours["step"]) == STEPS
  for a, b in zip(helpers.leaves(ours), helpers.leaves(theirs), strict=True):
    np.testing.assert_array_equal(a, b)


def test_sigterm_saves_the_current_step_exits_0_and_the_next_run_goes_on_from_there(
  shared, reference, tmp_path
):
  _, reference_losses = reference
  # During start-up: the run stops before its first step, with status 0 and nothing to save.
  run = helpers.Run(shared, tmp_path, num_train_steps=STEPS, checkpoint_every_steps=1000)
  run.wait_for(r"model: TransformerConfig")
  run.process.send_signal(signal.SIGTERM)
  assert run.finish(timeout=120) == 0, run.output[-3000:]
  assert "stopped before the first step" in run.output
  assert helpers.committed_steps(tmp_path) == []
  # During training: a checkpoint of the step it was in, status 0.
  run = helpers.Run(shared, tmp_path, num_train_steps=STEPS, checkpoint_every_steps=1000)
  run.wait_for(r"\] step 3/")
  run.process.send_signal(signal.SIGTERM)
  assert run.finish(timeout=120) == 0, run.output[-3000:]
  stopped = int(re.search(r"stopped at step (\d+) for preemption", run.output).group(1))
  assert stopped >= 3 and stopped == max(helpers.logged_steps(run.output))
  assert helpers.committed_steps(tmp_path) == [stopped]
  output = helpers.Run(
    shared, tmp_path, num_train_steps=STEPS, checkpoint_every_steps=1000
  ).succeed()
  assert _resumed_at(output) == stopped and helpers.logged_steps(output)[0] == stopped + 1
  _assert_losses_match(tmp_path, reference_losses)


class _Manager:
  directory = "/nowhere"

  def reached_preemption(self, step):
    del step
    return False


def test_a_run_that_cannot_stop_after_sigterm_exits_143_after_the_grace_period():
  exits = []
  with PreemptionWatch(_Manager(), grace_seconds=0.2, exit_fn=exits.append) as watch:
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while not exits and time.monotonic() < deadline:
      time.sleep(0.01)
    assert watch(5)
  assert exits == [143]
  exits.clear()
  with PreemptionWatch(_Manager(), grace_seconds=0.5, exit_fn=exits.append):
    os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(1.0)  # The watch ended (the run stopped in time): no exit.
  assert exits == []


def test_a_full_disk_keeps_the_good_checkpoints_and_the_next_run_resumes_from_them(
  shared, reference, tmp_path
):
  _, reference_losses = reference
  steps = 12
  run = helpers.Run(
    shared, tmp_path, num_train_steps=steps, keep_checkpoints=2, on_checkpoint_save_error="continue"
  )
  _poll(lambda: 4 in helpers.committed_steps(tmp_path), run)
  # From now on no file of the run may grow past 40 kB: checkpoints need more, the logs less.
  resource.prlimit(run.process.pid, resource.RLIMIT_FSIZE, (40_000, resource.RLIM_INFINITY))
  assert run.finish() == 1, run.output[-3000:]
  good = int(
    re.search(
      r"error: the checkpoint of step 12 could not be written .* latest good "
      r"checkpoint in \S+ is step (\d+)",
      run.output,
    ).group(1)
  )
  assert 4 <= good < steps
  for step in range(good + 2, steps + 1, 2):
    assert f"could not save the checkpoint of step {step} in" in run.output, step
  assert "File too large" in run.output
  errors = [line for line in run.lines if line.startswith("error: ")]
  assert len(errors) == 1, errors
  # No traceback through our code (tensorstore prints some of its own after a failed write).
  assert f'File "{helpers.REPO / "transformer_jax"}' not in run.output
  assert helpers.committed_steps(tmp_path) == [good - 2, good]  # Kept, not deleted.
  assert helpers.partial_writes(tmp_path) == []  # Cleaned up.
  output = helpers.Run(shared, tmp_path, num_train_steps=steps).succeed()
  assert _resumed_at(output) == good and f"done: step {steps}/{steps}" in output
  for losses in helpers.scalars_per_run(tmp_path):
    for step, loss in losses.items():
      assert loss == reference_losses[step], step


def test_diverging_updates_are_skipped_then_the_run_stops_with_one_error_line(shared, tmp_path):
  run = helpers.Run(
    shared, tmp_path, num_train_steps=STEPS, learning_rate=1e30, max_consecutive_nonfinite_steps=3
  )
  assert run.finish() == 1, run.output[-3000:]
  errors = [line for line in run.lines if line.startswith("error: ")]
  assert len(errors) == 1 and "3 updates in a row" in errors[0], run.output[-3000:]
  assert "max_consecutive_nonfinite_steps=3" in errors[0]
  assert "Traceback" not in run.output
  assert re.search(r"skipped 1 non-finite update \(\d+ this run\)", run.output)
  # The checkpoints hold finite parameters: skipped updates did not reach them.
  for step in helpers.committed_steps(tmp_path):
    for leaf in helpers.leaves(helpers.restore_state(tmp_path, step)):
      assert np.all(np.isfinite(leaf)), step
