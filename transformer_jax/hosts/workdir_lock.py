"""Which run holds a work directory: `<workdir>/lock.json` (`WorkdirLock`).

A training run's process 0 writes the lock and refreshes it with its beats
(`liveness.Heartbeat`): a second run on the same work directory stops at
once, naming the holder. A lock whose process is gone (on this host) or whose
beats stopped (on any host) is stale and taken over.
"""

import json
import logging
import os
import socket
import time

from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import UserError
from transformer_jax.hosts.liveness import (
  Heartbeat,
  describe,
  read_record,
  same_process,
  write_record,
)
from transformer_jax.workdir import Workdir

log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


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
      holder.get("pid") == os.getpid() or not _pid_alive(int(holder.get("pid", 0)))
    ):
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
          f"{self.path}): wait for that run to end or stop it, or use another --workdir"
        )
      taken_over = (
        f"took over the lock of a run that is no longer running "
        f"({describe(holder or {})}): {reason}"
      )
      self._remove_if_unchanged(holder)
    raise WorkdirInUseError(f"another run took the lock {self.path} at the same time")

  def _remove_if_unchanged(self, holder: dict | None) -> None:
    """Remove the lock if it still holds `holder`'s record: moved aside under a name of this
    process's (one rename succeeds), then checked; another run's fresh lock goes back."""
    if fileio.is_url(self.path):  # No atomic rename in object stores.
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
    if fileio.is_url(
      self.path
    ):  # Object stores have no exclusive create: the check is best effort.
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
