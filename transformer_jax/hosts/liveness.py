"""Which processes of a run are alive: their heartbeat files, and the ones that went silent.

Each process of a run writes `<workdir>/hosts/process_<i>.json` (its host,
pid and clock time) every few seconds from a thread of its own (`Heartbeat`),
so the beats go on while its main thread waits in a collective or compiles.
When a run stops because a process stopped answering, the processes whose
beats stopped and who did not say they ended are the lost ones
(`lost_processes`). Nothing here touches the devices: the supervisor of a
process (`supervisor.py`) reads these files beside a process that may hang in them.
"""

import logging
import os
import socket
import threading
import time

from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import UserError, first_line
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)


def beat_interval(timeout_seconds: float) -> float:
  """Seconds between beats, for a run that declares a process lost after `timeout_seconds`."""
  return max(1.0, min(30.0, timeout_seconds / 5))


def read_record(path: str) -> dict | None:
  """The JSON record at `path`; None when it is missing or unreadable (being replaced)."""
  try:
    return fileio.read_json(path, missing=None)
  except UserError:
    return None


def write_record(path: str, record: dict) -> None:
  """Write `record` to `path` whole, whichever process this is: readers see the old record or
  the new one."""
  fileio.write_json(path, record, every_process=True)


def describe(record: dict) -> str:
  """'host h, pid 12, since 2026-11-23 01:02:03 UTC'."""
  since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("since", 0)))
  return f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, since {since}"


def own_record(**fields) -> dict:
  """A record naming this process: host, pid, since (now) and `fields`."""
  now = time.time()
  return {"host": socket.gethostname(), "pid": os.getpid(), "since": now, "time": now, **fields}


def same_process(record: dict | None, other: dict) -> bool:
  """Whether `record` names the process of `other` (`own_record`): its host, pid and start."""
  return record is not None and all(
    record.get(key) == other[key] for key in ("host", "pid", "since")
  )


class LockTakenOverError(Exception):
  """A record this process refreshes names another process now (`Heartbeat`'s `write`)."""


class Heartbeat:
  """Rewrites `record` (with the time) to each of `paths` every `interval` seconds, from a daemon
  thread, while in its `with` block; on leaving it, marks the records ended.

  `write(path, record)` writes a record (`write_record` by default); when it
  raises LockTakenOverError, that path is left alone from then on, with the
  error logged once (a lock another run took over).
  """

  def __init__(self, paths: list[str], record: dict, interval: float, *, write=None):
    self.paths, self.record, self.interval = paths, dict(record), interval
    self.write = write or write_record
    self.lost: set[str] = set()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

  def _write(self) -> None:
    self.record["time"] = time.time()
    for path in self.paths:
      if path in self.lost:
        continue
      try:
        self.write(path, self.record)
      except LockTakenOverError as error:
        self.lost.add(path)
        log.error("%s", error)
      except Exception as error:  # Whatever the storage raised: the next beat tries again.
        log.warning("could not write the heartbeat %s: %s", path, first_line(error))

  def _run(self) -> None:
    while not self._stop.wait(self.interval):
      self._write()

  def __enter__(self):
    epath.Path(os.path.dirname(self.paths[0])).mkdir(parents=True, exist_ok=True)
    self._write()
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join()
    self.record["ended"] = "exited"
    self._write()


def mark_ended(path: str, how: str) -> None:
  """Record in the heartbeat file at `path` that its process ended (`how`)."""
  record = read_record(path)
  if record is not None:
    record["ended"] = how
    write_record(path, record)


def heartbeat_records(workdir: Workdir) -> dict[str, dict | None]:
  """`{path: record}` of every heartbeat file in `workdir`."""
  directory = epath.Path(workdir.hosts)
  if not directory.is_dir():
    return {}
  return {str(path): read_record(str(path)) for path in directory.glob("process_*.json")}


def lost_processes(
  workdir: Workdir, run: int, wait_seconds: float, *, sleep=time.sleep
) -> list[dict]:
  """The heartbeat records of run `run` in `workdir` that neither changed within `wait_seconds`
  nor say their process ended: the processes of the run that are gone."""
  before = heartbeat_records(workdir)
  sleep(wait_seconds)
  lost = []
  for path, first in sorted(before.items()):
    last = read_record(path)
    if last is not None and last == first and last.get("run") == run and not last.get("ended"):
      lost.append(last)
  return sorted(lost, key=lambda record: record.get("process", 0))
