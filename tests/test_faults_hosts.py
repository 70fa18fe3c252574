"""Faults of runs on several processes, and of two runs on one work directory.

Runs of 2 processes x 4 CPU devices (gloo collectives) through the command
line, each process under its supervisor (`transformer_jax.supervisor`), with
a checkpoint every 2 steps and a loss logged at every step. Every loss that
any run logged must equal, bitwise, the loss of that step in one
uninterrupted 2-process run that saves no checkpoint before its end: a fault
loses nothing but the steps since the last committed checkpoint.
"""

import json
import re
import signal
import time

import pytest
from etils import epath

import helpers

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

STEPS = 10
TIMEOUT = 10  # config.host_timeout_seconds of these runs.


def _start(shared, workdir, **overrides) -> list[helpers.Run]:
  """The two processes of a run of STEPS steps in `workdir`."""
  port = helpers.free_port()
  overrides = {"num_train_steps": STEPS, "host_timeout_seconds": TIMEOUT, **overrides}
  return [
    helpers.Run(
      shared,
      workdir,
      f"--coordinator_address=127.0.0.1:{port}",
      "--num_processes=2",
      f"--process_id={i}",
      devices=4,
      **overrides,
    )
    for i in range(2)
  ]


@pytest.fixture(scope="module")
def reference(shared, tmp_path_factory):
  """{step: loss} of an uninterrupted 2-process run that saves no checkpoint before its end."""
  workdir = tmp_path_factory.mktemp("reference")
  for run in _start(shared, workdir, checkpoint_every_steps=STEPS):
    run.succeed()
  (losses,) = helpers.scalars_per_run(workdir)  # Process 0 writes them.
  assert sorted(losses) == list(range(1, STEPS + 1))
  return losses


def _assert_losses_match(workdir, reference_losses, *, runs: int):
  """Every loss that each of `runs` runs in `workdir` logged equals the reference's; together
  they logged every step."""
  per_run = helpers.scalars_per_run(workdir)
  assert len(per_run) == runs
  for number, losses in enumerate(per_run):
    for step, loss in losses.items():
      assert loss == reference_losses[step], f"run {number}, step {step}"
  assert set().union(*per_run) == set(range(1, STEPS + 1))


def _resumed_at(run: helpers.Run) -> int:
  return int(run.wait_for(r"resumed from \S+ at step (\d+)").group(1))


def test_a_preempted_a_killed_and_a_broken_run_in_turn_lose_only_the_steps_since_a_checkpoint(
  shared, reference, tmp_path
):
  """Three runs in one work directory, each ending in a fault that the next one recovers from:
  SIGTERM to every process (each saves the same step and exits 0); a killed process (the survivor
  names it); process 1's data position of the newest checkpoint altered (only process 1 reads it,
  and every process skips that checkpoint)."""
  # SIGTERM to every process.
  runs = _start(shared, tmp_path)
  runs[0].wait_for(r"\] step 3/")
  lock = json.loads((tmp_path / "lock.json").read_text())  # One for the run, by process 0.
  assert lock["processes"] == 2 and lock["pid"] != runs[0].process.pid  # Its supervised child.
  assert sorted(p.name for p in (tmp_path / "hosts").glob("process_*")) == [
    "process_0.json",
    "process_1.json",
  ]
  for run in runs:
    run.process.send_signal(signal.SIGTERM)
  outputs = [run.succeed() for run in runs]
  stopped = {
    int(re.search(r"stopped at step (\d+) for preemption", out).group(1)) for out in outputs
  }
  assert len(stopped) == 1 and stopped <= set(helpers.committed_steps(tmp_path)), stopped
  (stopped,) = stopped
  assert stopped + 2 < STEPS, stopped
  # A killed process.
  runs = _start(shared, tmp_path)
  runs[1].wait_for(rf"\] step {stopped + 2}/")
  runs[1].process.kill()
  killed = time.monotonic()
  error = runs[0].fail(timeout=120)
  waited = time.monotonic() - killed
  assert {_resumed_at(run) for run in runs} == {stopped}
  newest = helpers.committed_steps(tmp_path)[-1]
  assert re.search(
    rf"lost contact with process 1 of 2 \(host \S+, pid \d+, since .*\): its "
    rf"heartbeat stopped; the newest committed checkpoint in \S+ is step {newest}\. "
    "Start all processes again",
    error,
  ), error
  assert waited < TIMEOUT + 30, waited
  # A checkpoint broken for process 1 only.
  before = helpers.committed_steps(tmp_path)[-2]
  path = tmp_path / "checkpoints" / str(newest)
  position = path / "data" / "process_1-of-2.json"
  state = json.loads(position.read_text())
  position.write_text(json.dumps({**state, "altered": 1}))
  runs = _start(shared, tmp_path)
  for run in runs:
    run.succeed()
  assert {_resumed_at(run) for run in runs} == {before}
  # Unusable for the alteration alone (not for the kill): process 1 read a position that differs
  # from the one saved, process 0 read its part and skipped the step for process 1.
  unusable = (
    f"checkpoint {path} is unusable, skipping it: CorruptCheckpointError: checkpoint {path}"
  )
  assert f"{unusable}: the data position read back differs from the one saved" in runs[1].output, (
    runs[1].output[-3000:]
  )
  assert f"{unusable} cannot be read on process 1 (see its log)" in runs[0].output, runs[0].output[
    -3000:
  ]
  _assert_losses_match(tmp_path, reference, runs=3)


def test_a_second_run_on_a_work_directory_stops_and_a_stale_lock_is_taken_over(shared, tmp_path):
  first = helpers.Run(shared, tmp_path, num_train_steps=1000, host_timeout_seconds=TIMEOUT)
  first.wait_for(r"\] step 1/")
  lock = json.loads((tmp_path / "lock.json").read_text())
  assert lock["pid"] == first.process.pid
  second = helpers.Run(shared, tmp_path, num_train_steps=1000)
  error = second.fail(timeout=120)
  assert re.search(
    rf"the work directory is in use by another run \(host {lock['host']}, pid "
    rf"{first.process.pid}, since .* UTC; lock \S+lock.json\)",
    error,
  ), error
  first.process.kill()
  first.finish()
  third = helpers.Run(shared, tmp_path, num_train_steps=1000)
  third.wait_for(
    r"took over the lock of a run that is no longer running \(host \S+, pid "
    rf"{first.process.pid}, .*\): its process is gone"
  )
  third.wait_for(r"\] step \d+/")
  third.process.send_signal(signal.SIGTERM)
  third.succeed()
  assert not (tmp_path / "lock.json").exists()


def test_two_processes_share_a_work_directory_in_a_bucket_and_lose_nothing_to_a_killed_one(
  shared, reference, bucket_dir
):
  """The run of two processes in the tests' GCS server's bucket: process 0's lock and both
  heartbeats are there, the survivor of a killed process names it from its heartbeat there, and
  the next run resumes from the bucket's newest checkpoint with the reference's losses."""
  runs = _start(shared, bucket_dir)
  runs[1].wait_for(r"\] step 3/")
  lock = json.loads(epath.Path(bucket_dir, "lock.json").read_text())
  assert lock["processes"] == 2 and lock["pid"] != runs[0].process.pid  # Its supervised child.
  beats = sorted(p.name for p in epath.Path(bucket_dir, "hosts").glob("process_*"))
  assert beats == ["process_0.json", "process_1.json"]
  runs[1].process.kill()
  error = runs[0].fail(timeout=120)
  newest = helpers.committed_steps(bucket_dir)[-1]
  assert re.search(
    rf"lost contact with process 1 of 2 \(host \S+, pid \d+, since .*\): its heartbeat "
    rf"stopped; the newest committed checkpoint in {bucket_dir}/checkpoints is step {newest}\.",
    error,
  ), error
  runs = _start(shared, bucket_dir)
  for run in runs:
    run.succeed()
  assert {_resumed_at(run) for run in runs} == {newest}
  assert not epath.Path(bucket_dir, "lock.json").exists()
  assert not (helpers.REPO / "gs:").exists()
  _assert_losses_match(bucket_dir, reference, runs=2)


def test_a_run_whose_lock_another_run_took_over_stops_without_saving(shared, tmp_path):
  """The lock names another run (one that took it over while this one was silent): at its next
  checkpoint this run stops, saving nothing over that run's checkpoints, and leaves the lock."""
  run = helpers.Run(
    shared, tmp_path, num_train_steps=100_000, checkpoint_every_steps=50, host_timeout_seconds=5
  )
  run.wait_for(r"\] step 1/")
  other = {"host": "elsewhere", "pid": 7, "since": 1.0, "time": time.time() + 3600}
  (tmp_path / "lock.json").write_text(json.dumps(other))
  error = run.fail(timeout=120)
  match = re.search(
    r"the work directory's lock was taken over by another run \(see the error above\): this "
    r"run stopped at step (\d+) without saving it",
    error,
  )
  assert match, error
  assert max(helpers.committed_steps(tmp_path), default=0) < int(match.group(1))
  assert "lock.json no longer names this run (host elsewhere, pid 7" in run.output
  assert json.loads((tmp_path / "lock.json").read_text()) == other
