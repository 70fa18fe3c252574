"""The supervisor of a multi-process run's process (`transformer_jax.supervisor`); the whole of it
runs in tests/test_faults_hosts.py."""

import io

from transformer_jax import supervisor
from transformer_jax.hosts import liveness
from transformer_jax.workdir import Workdir


def test_output_passes_through_until_the_runtime_aborts():
  child = io.BytesIO(
    b"I step 1\nE coordination_service_agent.cc:289] Polled an error\n"
    b"F client.h:80] Terminating process because the JAX distributed service\n"
    b"Fatal Python error: Aborted\n"
  )
  out = io.BytesIO()
  held = supervisor._pass_through(child, out)
  assert out.getvalue() == b"I step 1\nE coordination_service_agent.cc:289] Polled an error\n"
  assert len(held) == 2 and held[-1] == b"Fatal Python error: Aborted\n"


def _workdir(tmp_path, steps):
  workdir = Workdir(str(tmp_path))
  for name in steps:
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  (tmp_path / "hosts").mkdir()
  for process in range(2):
    liveness.write_record(
      workdir.heartbeat_file(process),
      {
        "process": process,
        "processes": 2,
        "host": f"h{process}",
        "pid": 10 + process,
        "since": 0,
        "time": 5.0,
        "run": 9,
      },
    )
  return workdir


def test_the_lost_process_and_the_newest_committed_step_are_named(tmp_path):
  workdir = _workdir(tmp_path, ["2", "4", "6.orbax-checkpoint-tmp"])
  liveness.mark_ended(workdir.heartbeat_file(0), "lost contact")
  waits = []
  message = supervisor.lost_contact_message(workdir, 9, 10, sleep=waits.append)
  assert waits == [5.0]  # Two beats of a 10 s timeout, and a second.
  assert message == (
    "lost contact with process 1 of 2 (host h1, pid 11, since 1970-01-01 00:00:00 UTC): its "
    f"heartbeat stopped; the newest committed checkpoint in {tmp_path}/checkpoints is step 4. "
    "Start all processes again to resume from it"
  )


def test_when_no_process_went_silent_there_is_no_message(tmp_path):
  workdir = _workdir(tmp_path, [])
  for process in range(2):
    liveness.mark_ended(workdir.heartbeat_file(process), "exited")
  assert supervisor.lost_contact_message(workdir, 9, 10, sleep=lambda seconds: None) is None
