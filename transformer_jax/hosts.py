"""Which processes of a run are alive, and which run holds a work directory.

Each process of a run writes `<workdir>/hosts/process_<i>.json` (its host,
pid and clock time) every few seconds from a thread of its own (`Heartbeat`),
so the beats go on while its main thread waits in a collective or compiles.
When a run stops because a process stopped answering, the processes whose
beats stopped and who did not say they ended are the lost ones
(`lost_processes`).

A training run holds `<workdir>/lock.json` (`WorkdirLock`), written by its
process 0 and refreshed with its beats: a second run on the same work
directory stops at once, naming the holder. A lock whose process is gone (on
this host) or whose beats stopped (on any host) is stale and taken over.
Nothing here uses JAX: the supervisor of a process (`supervisor.py`) reads
these files without touching the devices.
"""

import json
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
    return json.loads(epath.Path(path).read_text())
  except (OSError, ValueError):
    return None


def write_record(path: str, record: dict) -> None:
  """Write `record` to `path` whole: readers see the old record or the new one."""
  fileio.write_atomically(path, json.dumps(record))


def describe(record: dict) -> str:
  """'host h, pid 12, since 2026-11-23 01:02:03 UTC'."""
  since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("since", 0)))
  return f"host {record.get('host', '?')}, pid {record.get('pid', '?')}, since {since}"


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


def own_record(**fields) -> dict:
  """A record naming this process: host, pid, since (now) and `fields`."""
  now = time.time()
  return {"host": socket.gethostname(), "pid": os.getpid(), "since": now, "time": now, **fields}


def same_process(record: dict | None, other: dict) -> bool:
  """Whether `record` names the process of `other` (`own_record`): its host, pid and start."""
  return record is not None and all(record.get(key) == other[key]
                                    for key in ("host", "pid", "since"))


class Heartbeat:
  """Rewrites `record` (with the time) to each of `paths` every `interval` seconds, from a daemon
  thread, while in its `with` block; on leaving it, marks the records ended.

  With `owned`, a file is rewritten only while it still names this process
  (`same_process`): one that names another process is left alone, with an
  error logged once; one that cannot be read this beat (being replaced) is
  tried again at the next.
  """

  def __init__(self, paths: list[str], record: dict, interval: float, *, owned: bool = False):
    self.paths, self.record, self.interval, self.owned = paths, dict(record), interval, owned
    self.lost: set[str] = set()
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

  def _write(self) -> None:
    self.record["time"] = time.time()
    for path in self.paths:
      if path in self.lost:
        continue
      if self.owned:
        holder = read_record(path)
        if holder is None:
          continue
        if not same_process(holder, self.record):
          self.lost.add(path)
          log.error("%s no longer names this run (%s): another run took it over; this run no "
                    "longer refreshes it", path, describe(holder))
          continue
      try:
        write_record(path, self.record)
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


def lost_processes(workdir: Workdir, run: int, wait_seconds: float, *,
                   sleep=time.sleep) -> list[dict]:
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


class WorkdirInUseError(UserError):
  """Another run holds the work directory."""


class WorkdirLock:
  """`<workdir>/lock.json`: which run may write checkpoints in `workdir`.

  `acquire` creates it (exclusively, on a local file system) with this
  process's record, or raises WorkdirInUseError naming the run that holds it;
  a lock whose pid is gone (same host) or whose record was not refreshed for
  `stale_after` seconds is taken over with a warning returned. Of several
  runs taking over the same stale lock at once, one gets it (on a local file
  system; object stores are best effort). `heartbeat` refreshes it while this
  process holds it; `release` removes it when it is still this process's.
  """

  def __init__(self, workdir: Workdir, stale_after: float):
    self.path = workdir.lock_file
    self.stale_after = stale_after

  def stale(self, holder: dict | None) -> str | None:
    """Why the lock of `holder` is stale, or None while its run may be alive."""
    if holder is None:  # Being written (where hard links fail), or left half-written.
      try:
        age = time.time() - epath.Path(self.path).stat().mtime
      except OSError:
        return None
      return f"its lock file is unreadable and {age:.0f} s old" if age > self.stale_after else None
    if holder.get("host") == socket.gethostname() and (
        holder.get("pid") == os.getpid() or not _pid_alive(int(holder.get("pid", 0)))):
      return "its process is gone"  # The same pid here is a restarted container's.
    silent = time.time() - float(holder.get("time", 0))
    if silent > self.stale_after:
      return f"it has not refreshed the lock for {silent:.0f} s"
    return None

  def acquire(self, record: dict) -> str | None:
    """Take the lock for `record` (`own_record()`); returns a warning when a stale lock was taken
    over."""
    taken_over = None
    for _ in range(2):
      if self._create(record):
        return taken_over
      holder = read_record(self.path)
      reason = self.stale(holder)
      if reason is None:
        raise WorkdirInUseError(
            f"the work directory is in use by another run ({describe(holder or {})}; lock "
            f"{self.path}): wait for that run to end or stop it, or use another --workdir")
      taken_over = (f"took over the lock of a run that is no longer running "
                    f"({describe(holder or {})}): {reason}")
      self._remove_if_unchanged(holder)
    raise WorkdirInUseError(f"another run took the lock {self.path} at the same time")

  def _remove_if_unchanged(self, holder: dict | None) -> None:
    """Remove the lock if it still holds `holder`'s record: moved aside under a name of this
    process's (one rename succeeds), then checked; another run's fresh lock goes back."""
    if "://" in self.path:  # No atomic rename in object stores.
      epath.Path(self.path).unlink(missing_ok=True)
      return
    aside = fileio.temporary_name(self.path)
    try:
      os.rename(self.path, aside)
    except FileNotFoundError:  # Another run moved it first.
      return
    try:
      if read_record(aside) != holder:  # Taken by another run meanwhile: give it back.
        self._give_back(aside)
    finally:
      if os.path.exists(aside):
        os.unlink(aside)

  def _give_back(self, aside: str) -> None:
    """Put the lock moved to `aside` back, unless a lock appeared meanwhile."""
    try:
      os.link(aside, self.path)  # Fails when a lock exists.
    except FileExistsError:
      log.error("the lock %s of another run was replaced while being given back", self.path)
    except OSError:  # A file system without hard links.
      if not os.path.exists(self.path):
        os.rename(aside, self.path)

  def _create(self, record: dict) -> bool:
    if "://" in self.path:  # Object stores have no exclusive create: the check is best effort.
      if epath.Path(self.path).exists():
        return False
      write_record(self.path, record)
      return True
    temporary = fileio.temporary_name(self.path)
    with open(temporary, "w") as f:
      json.dump(record, f)
    try:  # A hard link appears whole, and fails when the lock exists.
      os.link(temporary, self.path)
    except FileExistsError:
      return False
    except OSError:  # A file system without hard links: create it, then fill it.
      try:
        with open(self.path, "x") as f:
          json.dump(record, f)
      except FileExistsError:
        return False
    finally:
      os.unlink(temporary)
    return True

  def heartbeat(self, record: dict, interval: float) -> Heartbeat:
    """Refreshes the lock with `record` while it names this process."""
    return Heartbeat([self.path], record, interval, owned=True)

  def release(self, record: dict) -> None:
    if same_process(read_record(self.path), record):
      epath.Path(self.path).unlink(missing_ok=True)
