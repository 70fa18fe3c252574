"""Runs one process of a multi-process run as a child, and says in one line what stopped it.

When another process of a run dies, JAX ends the survivors in ways a user
cannot read: a collective fails with a connection error, or the distributed
runtime aborts the process (a C++ check failure and a dump of every thread)
when the coordinator is gone or a heartbeat times out. The process the user
starts supervises the real one: it passes its output and signals through,
holds back the runtime's dump, and when the child ended that way it names the
processes that stopped beating (`liveness.lost_processes`) and the newest
committed checkpoint in one `error:` line, exit status 1. The child dies with
its supervisor (Linux), so killing the process the user started kills the run.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading

from transformer_jax.checkpoints import store
from transformer_jax.hosts import liveness
from transformer_jax.workdir import Workdir

SUPERVISED_ENV = "TRANSFORMER_JAX_SUPERVISED"
LOST_CONTACT_STATUS = 75  # A child whose collective failed in a multi-process run exits with it.
# Where the output of a process that JAX's runtime aborts starts to be noise.
_RUNTIME_ABORT = (
  "Terminating process because the JAX distributed",
  "terminate called after throwing",
  "Fatal Python error",
)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pass_through(stream, out) -> list[bytes]:
  """Copy the lines of `stream` to `out` until the runtime's abort starts; returns the lines held
  back from there on."""
  held = []
  for line in stream:
    if held or any(mark.encode() in line for mark in _RUNTIME_ABORT):
      held.append(line)
    else:
      out.write(line)
      out.flush()
  return held


def _child_record(workdir: Workdir) -> tuple[str, dict] | tuple[None, None]:
  """The path and heartbeat record of this supervisor's child, if it wrote one."""
  for path, record in liveness.heartbeat_records(workdir).items():
    if (
      record
      and record.get("supervisor") == os.getpid()
      and (record.get("host") == socket.gethostname())
    ):
      return path, record
  return None, None


def lost_contact_message(
  workdir: Workdir, run: int, timeout_seconds: float, *, sleep=None
) -> str | None:
  """What to tell the user when processes of run `run` went silent (None when none did)."""
  wait = 2 * liveness.beat_interval(timeout_seconds) + 1
  kwargs = {} if sleep is None else {"sleep": sleep}
  lost = liveness.lost_processes(workdir, run, wait, **kwargs)
  if not lost:
    return None
  steps = store.committed_steps(workdir.checkpoints)
  newest = (
    f"the newest committed checkpoint in {workdir.checkpoints} is step {steps[-1]}"
    if steps
    else f"there is no committed checkpoint in {workdir.checkpoints} yet"
  )
  names = "; ".join(
    f"process {r.get('process')} of {r.get('processes')} ({liveness.describe(r)})" for r in lost
  )
  return (
    f"lost contact with {names}: its heartbeat stopped; {newest}. Start all processes "
    "again to resume from it"
  )


def supervise(argv: list[str], workdir: Workdir, timeout_seconds: float) -> int:
  """Run `python -m transformer_jax.main argv[1:]` as a supervised child; returns the exit status
  to end with."""
  child = subprocess.Popen(
    [sys.executable, "-m", "transformer_jax.main", *argv[1:]],
    env=dict(os.environ, **{SUPERVISED_ENV: "1"}),
    stderr=subprocess.PIPE,
    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
  )
  forwarded = {
    signum: signal.signal(signum, lambda signum, frame: child.send_signal(signum))
    for signum in (signal.SIGTERM, signal.SIGINT)
  }
  held = []
  # A thread copies the output: processes the child started (data workers) may hold it open.
  copier = threading.Thread(
    target=lambda: held.extend(_pass_through(child.stderr, sys.stderr.buffer)), daemon=True
  )
  copier.start()
  status = child.wait()
  copier.join(timeout=5)
  for signum, handler in forwarded.items():
    signal.signal(signum, handler)
  if status in (LOST_CONTACT_STATUS, -signal.SIGABRT):
    path, record = _child_record(workdir)
    if path is not None:
      liveness.mark_ended(path, "lost contact")
      message = lost_contact_message(workdir, record.get("run"), timeout_seconds)
      if message is None and status == LOST_CONTACT_STATUS:
        message = (
          "this process stopped on the failure in the warning above (--verbosity=1 "
          "shows its traceback), and no other process of the run went silent"
        )
      if message is not None:
        print(f"error: {message}", file=sys.stderr)
        return 1
  sys.stderr.buffer.write(b"".join(held))  # Not a lost process: what the child said stands.
  return status if status >= 0 else 128 - status
