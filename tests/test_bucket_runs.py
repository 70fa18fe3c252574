"""Runs whose work directory is in a bucket (the tests' GCS server, `gcs_stand_in`), the data
directory too in the first: checkpoints there, a resume from them with the losses of a run on
the local disk (its TensorBoard scalars bit for bit), then average, eval and translate."""

import re
import signal

import pytest
from etils import epath

import helpers
from transformer_jax.cli import inspect_checkpoints

STEPS = 40
LOGGED_LOSS = re.compile(r"step (\d+)/\d+ \| loss ([0-9.]+)")


def _run(shared, workdir, *arguments, **overrides) -> str:
  result = helpers.python(
    "-m",
    "transformer_jax.main",
    f"--workdir={workdir}",
    *arguments,
    *helpers.flags(shared, **overrides),
    shared=shared,
  )
  output = result.stdout + result.stderr
  assert result.returncode == 0, output[-3000:]
  return output


def _losses(output: str) -> dict[int, str]:
  """{step: its logged loss, as printed}."""
  return {int(step): loss for step, loss in LOGGED_LOSS.findall(output)}


@pytest.mark.slow
def test_a_run_in_a_bucket_resumes_from_its_checkpoints_as_a_run_on_disk_goes_on(
  shared, tmp_path, bucket_dir
):
  run, data = f"{bucket_dir}/run", {"data__source__data_dir": f"{bucket_dir}/tfds"}
  first = _losses(_run(shared, run, "--mode=train", num_train_steps=4, **data))
  assert epath.Path(f"{bucket_dir}/tfds/transformer_jax_embedded").is_dir()  # Prepared, uploaded.
  second = _run(shared, run, "--mode=train", num_train_steps=6, **data)
  assert f"resumed from {run}/checkpoints at step 4" in second
  on_disk = _losses(_run(shared, tmp_path / "disk", "--mode=train", num_train_steps=6))
  assert sorted(first) == [1, 2, 3, 4] and {**first, **_losses(second)} == on_disk
  assert helpers.scalars(run) == helpers.scalars(tmp_path / "disk")  # float32, bit for bit.
  steps = {p.name for p in epath.Path(f"{run}/checkpoints").iterdir()}
  assert {"4", "6"} <= steps
  evaluated = _run(
    shared, run, "--mode=average,eval", "--checkpoint=averaged", average_last=2, **data
  )
  assert re.search(r"test BLEU [0-9.]+", evaluated), evaluated[-2000:]
  assert epath.Path(f"{run}/averaged").exists() and list(epath.Path(f"{run}/eval").iterdir())
  epath.Path(f"{bucket_dir}/in.txt").write_text("the dog sees the cat .\n\nthe cat .\n")
  _run(
    shared,
    run,
    "--mode=translate",
    "--checkpoint=averaged",
    f"--input={bucket_dir}/in.txt",
    f"--output={bucket_dir}/out.txt",
    **data,
  )
  assert len(epath.Path(f"{bucket_dir}/out.txt").read_text().splitlines()) == 3
  assert not (helpers.REPO / "gs:").exists()  # Where the runs would put a gs:// path as local.


def _uninterrupted(shared, tmp_path) -> dict:
  """The TensorBoard losses of a run of STEPS steps on the local disk."""
  helpers.Run(shared, tmp_path / "disk", num_train_steps=STEPS).succeed()
  return helpers.scalars(tmp_path / "disk")


@pytest.mark.slow
def test_in_a_bucket_sigterm_saves_the_step_and_sigkill_loses_only_what_followed_a_checkpoint(
  shared, tmp_path, bucket_dir
):
  run_dir = f"{bucket_dir}/run"
  run = helpers.Run(shared, run_dir, num_train_steps=STEPS, checkpoint_every_steps=1000)
  run.wait_for(r"\] step 3/")
  run.process.send_signal(signal.SIGTERM)
  assert run.finish(timeout=120) == 0, run.output[-3000:]
  match = re.search(r"stopped at step (\d+) for preemption", run.output)
  assert match and int(match.group(1)) + 3 < STEPS, run.output[-3000:]
  stopped = int(match.group(1))
  assert helpers.committed_steps(run_dir) == [stopped]
  run = helpers.Run(shared, run_dir, num_train_steps=STEPS, checkpoint_every_steps=2)
  run.wait_for(rf"\] step {stopped + 3}/")
  run.process.kill()
  run.finish()
  assert run.process.returncode == -signal.SIGKILL
  committed = max(helpers.committed_steps(run_dir))
  output = helpers.Run(shared, run_dir, num_train_steps=STEPS, checkpoint_every_steps=2).succeed()
  assert f"resumed from {run_dir}/checkpoints at step {committed}" in output
  assert helpers.scalars(run_dir) == _uninterrupted(shared, tmp_path)  # float32, bit for bit.
  assert not (helpers.REPO / "gs:").exists()


@pytest.mark.slow
def test_in_a_bucket_a_checkpoint_whose_write_was_cut_short_is_removed_and_written_again(
  shared, tmp_path, bucket_dir
):
  """In a bucket a step's objects appear as they are written, and Orbax's commit marker last (no
  directory is renamed at commit): a kill midway leaves the step's directory without it."""
  run_dir = f"{bucket_dir}/run"
  _run(shared, run_dir, "--mode=train", num_train_steps=4, checkpoint_every_steps=2)
  assert helpers.committed_steps(run_dir) == [2, 4]
  epath.Path(f"{run_dir}/checkpoints/4/commit_success.txt").unlink()  # Killed before the marker.
  lines, good = inspect_checkpoints.describe(f"{run_dir}/checkpoints", verify=True)
  assert good and re.fullmatch(r"step 2: [0-9.]+ MB, .*, verified", lines[0]), lines
  assert lines[1:] == ["4: an interrupted write (the next run removes it)"], lines
  resumed = _run(shared, run_dir, "--mode=train", num_train_steps=6, checkpoint_every_steps=2)
  assert f"resumed from {run_dir}/checkpoints at step 2" in resumed, resumed[-3000:]
  assert f"removed {run_dir}/checkpoints/4, left by a checkpoint write" in resumed
  assert helpers.committed_steps(run_dir) == [2, 4, 6], resumed[-5000:]
  helpers.Run(shared, tmp_path / "disk", num_train_steps=6, checkpoint_every_steps=2).succeed()
  assert helpers.scalars(run_dir) == helpers.scalars(tmp_path / "disk")  # float32, bit for bit.
