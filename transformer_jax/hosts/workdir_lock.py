"""Which run holds a work directory: `<workdir>/lock.json` (`WorkdirLock`).

A training run's process 0 writes the lock and refreshes it with its beats
(`liveness.Heartbeat`): a second run on the same work directory stops at
once, naming the holder. A lock whose process is gone (on this host) or whose
beats stopped (on any host) is stale and taken over, by one run only, on a
file system and in an object store (gs://) alike.
"""

import json
import logging
import os
import socket
import time

import tensorstore as ts
from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import UserError, first_line
from transformer_jax.hosts.liveness import (
  Heartbeat,
  LockTakenOverError,
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


# A refresh of the lock must end well within the lock's staleness (host_timeout_seconds, at
# least 5 s): TensorStore's default would retry a failing request for about 15 minutes.
_RETRIES = {"max_retries": 3, "initial_delay": "0.5s", "max_delay": "2s"}


class _ObjectRecord:
  """A JSON record in an object store (a URL) that is created, replaced and deleted only on
  condition of the generation read before (the store's preconditions, such as GCS's
  `ifGenerationMatch`, through TensorStore's key-value store): of two processes changing the
  same generation, one succeeds. Its operations raise UserError naming the URL."""

  def __init__(self, url: str):
    self.url = url
    directory, self.key = url.rsplit("/", 1)
    scheme, _, rest = directory.partition("://")
    bucket, _, path = rest.partition("/")
    # gs:// by bucket and path, as gcsfs and Orbax name objects (TensorStore's URL form would
    # percent-decode the path); other stores by TensorStore's URL.
    spec = (
      {
        "driver": "gcs",
        "bucket": bucket,
        "path": f"{path}/" if path else "",
        "gcs_request_retries": _RETRIES,
      }
      if scheme == "gs"
      else f"{directory}/"
    )
    self._store = self._result(lambda: ts.KvStore.open(spec), "open")

  def _result(self, future, what: str):
    try:
      return future().result()
    except ValueError as error:  # TensorStore's errors (permission, no answer, bad URL).
      raise UserError(f"{self.url}: cannot {what} the lock: {first_line(error)}") from None

  def read(self) -> tuple[dict | None, bool, bytes]:
    """(the record, None when unreadable or missing; whether the object exists; its generation)."""
    result = self._result(lambda: self._store.read(self.key), "read")
    if result.state != "value":
      return None, False, result.stamp.generation
    try:
      record = json.loads(result.value)
    except ValueError:
      record = None
    return (record if isinstance(record, dict) else None), True, result.stamp.generation

  def replace(self, record: dict | None, generation: bytes) -> bool:
    """Write `record` (None: delete) if the object is still at `generation`; whether it was."""
    value = None if record is None else json.dumps(record).encode("utf-8")
    written = self._result(lambda: self._store.write(self.key, value, if_equal=generation), "write")
    return written.generation != b""


class WorkdirLock:
  """`<workdir>/lock.json`: which run may write checkpoints in `workdir`.

  `acquire` creates it exclusively with this process's record, or raises
  WorkdirInUseError naming the run that holds it; a lock whose pid is gone
  (same host) or whose record was not refreshed for `stale_after` seconds is
  taken over with a warning returned. Of several runs taking over the same
  stale lock at once, exactly one gets it. `heartbeat` refreshes it while this
  process holds it; `release` removes it when it is still this process's.

  On a file system, creating is a hard link (which fails when the lock
  exists) and a takeover renames the stale lock aside first. An object store
  has neither: there every change is conditional on the generation of the
  object read before (`_ObjectRecord`).
  """

  def __init__(self, workdir: Workdir, stale_after: float):
    self.path = workdir.lock_file
    self.stale_after = stale_after
    self._object = _ObjectRecord(self.path) if fileio.is_url(self.path) else None

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
      holder, exists, version = self._read()
      if not exists:  # Released meanwhile.
        continue
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
      self._remove_if_unchanged(holder, version)
    raise WorkdirInUseError(f"another run took the lock {self.path} at the same time")

  def _read(self) -> tuple[dict | None, bool, bytes | None]:
    """The holder's record (None: unreadable or missing), whether the lock exists, and in a
    store the object's generation, on which a change is conditional (None on a file system)."""
    if self._object is not None:
      return self._object.read()
    return read_record(self.path), os.path.exists(self.path), None

  def _remove_if_unchanged(self, holder: dict | None, version: bytes | None) -> None:
    """Remove the lock if it is still as read (`_read`): in a store, if still at generation
    `version`; on a file system, moved aside under a name of this process's (one rename
    succeeds), then checked against `holder`, and another run's fresh lock goes back."""
    if self._object is not None:
      self._object.replace(None, version)
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
    if self._object is not None:
      _, exists, generation = self._object.read()
      return not exists and self._object.replace(record, generation)
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

  def _refresh(self, path: str, record: dict) -> None:
    """Rewrite the lock (`path`, this lock's) with `record` while it names this process (in a
    store, only if no other run changed it since it was read); raises LockTakenOverError when
    another run holds it, or when it is gone from a store (where a lock appears whole, so a
    missing one was removed: by hand, or by a run that took it over and ended)."""
    holder, exists, version = self._read()
    if holder is None:
      if self._object is not None and not exists:
        raise LockTakenOverError(f"{path} was removed: this run no longer refreshes it")
      return  # Being replaced on a file system: the next beat reads it again.
    if not same_process(holder, record):
      raise LockTakenOverError(
        f"{path} no longer names this run ({describe(holder)}): another run took it over; this "
        "run no longer refreshes it"
      )
    if self._object is not None:
      self._object.replace(record, version)  # Changed meanwhile: the next beat sees by whom.
    else:
      write_record(path, record)

  def heartbeat(self, record: dict, interval: float) -> Heartbeat:
    """Refreshes the lock with `record` while it names this process."""
    return Heartbeat([self.path], record, interval, write=self._refresh)

  def release(self, record: dict) -> None:
    holder, _, version = self._read()
    if not same_process(holder, record):
      return
    if self._object is not None:
      self._object.replace(None, version)
    else:
      epath.Path(self.path).unlink(missing_ok=True)
