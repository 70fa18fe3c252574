"""Heartbeats, lost processes and the work directory's lock (`transformer_jax.hosts`)."""

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from etils import epath

import helpers
from helpers import REPO
from transformer_jax import fileio
from transformer_jax.errors import UserError
from transformer_jax.hosts import liveness, workdir_lock
from transformer_jax.workdir import Workdir


def _dead_pid() -> int:
  process = subprocess.Popen([sys.executable, "-c", "pass"])
  process.wait()
  return process.pid


def test_a_heartbeat_refreshes_its_records_and_marks_them_ended(tmp_path):
  workdir = Workdir(str(tmp_path))
  paths = [workdir.heartbeat_file(3), workdir.lock_file]
  record = liveness.own_record(process=3)
  with liveness.Heartbeat(paths, record, interval=0.05):
    first = liveness.read_record(paths[0])
    time.sleep(0.3)
    later = liveness.read_record(paths[0])
    assert later["time"] > first["time"] and later["process"] == 3 and "ended" not in later
    assert liveness.read_record(paths[1])["pid"] == record["pid"]
  assert all(liveness.read_record(path)["ended"] == "exited" for path in paths)


def test_lost_processes_are_those_that_neither_beat_nor_ended(tmp_path):
  workdir = Workdir(str(tmp_path))
  (tmp_path / "hosts").mkdir()
  for process in range(3):
    liveness.write_record(
      workdir.heartbeat_file(process), {"process": process, "time": 1.0, "run": 5}
    )
  liveness.write_record(workdir.heartbeat_file(3), {"process": 3, "time": 1.0, "run": 4})  # Older.

  def meanwhile(seconds):  # Process 0 beats, process 2 ends; process 1 is silent.
    assert seconds == 7
    liveness.write_record(workdir.heartbeat_file(0), {"process": 0, "time": 2.0, "run": 5})
    liveness.mark_ended(workdir.heartbeat_file(2), "lost contact")

  lost = liveness.lost_processes(workdir, 5, 7, sleep=meanwhile)
  assert lost == [{"process": 1, "time": 1.0, "run": 5}]


def test_the_beat_interval_is_a_fifth_of_the_timeout_within_bounds():
  assert [liveness.beat_interval(t) for t in (2, 10, 60, 1000)] == [1.0, 2.0, 12.0, 30.0]


@pytest.fixture(params=["disk", "bucket"])
def root(request, tmp_path) -> str:
  """A work directory on the local disk, or in the tests' GCS server's bucket."""
  return str(tmp_path) if request.param == "disk" else request.getfixturevalue("bucket_dir")


def _write_lock(root: str, holder: dict) -> None:
  epath.Path(root).mkdir(parents=True, exist_ok=True)
  epath.Path(root, "lock.json").write_text(json.dumps(holder))


def test_a_lock_is_exclusive_and_names_its_holder(root):
  workdir = Workdir(root)
  lock = workdir_lock.WorkdirLock(workdir, stale_after=60)
  record = {**liveness.own_record(), "pid": os.getppid()}  # Another live process of this host.
  assert lock.acquire(record) is None
  with pytest.raises(
    workdir_lock.WorkdirInUseError,
    match=(
      rf"in use by another run \(host {socket.gethostname()}, pid {record['pid']}, since "
      r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC; lock .*lock.json\)"
    ),
  ):
    workdir_lock.WorkdirLock(workdir, stale_after=60).acquire(liveness.own_record())
  lock.release({**record, "pid": record["pid"] + 1})  # Not its holder: kept.
  assert epath.Path(root, "lock.json").exists()
  lock.release(record)
  assert not epath.Path(root, "lock.json").exists()


@pytest.mark.parametrize(
  "holder, reason",
  [
    (
      lambda: {"host": socket.gethostname(), "pid": _dead_pid(), "time": time.time()},
      "its process is gone",
    ),
    (
      lambda: {"host": "elsewhere", "pid": 1, "time": time.time() - 100},
      "it has not refreshed the lock for 100 s",
    ),
  ],
)
def test_a_stale_lock_is_taken_over_with_the_reason(root, holder, reason):
  _write_lock(root, holder())
  lock = workdir_lock.WorkdirLock(Workdir(root), stale_after=60)
  record = liveness.own_record()
  warning = lock.acquire(record)
  assert "took over the lock of a run that is no longer running" in warning
  assert warning.endswith(reason)
  assert liveness.read_record(lock.path)["pid"] == record["pid"]


def test_a_live_lock_of_another_host_is_kept(root):
  _write_lock(root, {"host": "elsewhere", "pid": 1, "since": 0, "time": time.time() - 10})
  with pytest.raises(
    workdir_lock.WorkdirInUseError, match="host elsewhere, pid 1, since 1970-01-01"
  ):
    held = workdir_lock.WorkdirLock(Workdir(root), stale_after=60)
    held.acquire(liveness.own_record())


def test_an_unreadable_lock_is_waited_for_until_it_is_old(tmp_path):
  (tmp_path / "lock.json").write_text("")
  lock = workdir_lock.WorkdirLock(Workdir(str(tmp_path)), stale_after=60)
  with pytest.raises(workdir_lock.WorkdirInUseError, match="host [?], pid [?]"):
    lock.acquire(liveness.own_record())
  os.utime(tmp_path / "lock.json", (time.time() - 100, time.time() - 100))
  assert re.search(
    r"its lock file is unreadable and 10\d s old$", lock.acquire(liveness.own_record())
  )


def test_a_lock_naming_this_very_process_is_stale():
  """A restarted container: the same host name and pid as the run that held the lock."""
  lock = workdir_lock.WorkdirLock(Workdir("/nonexistent"), stale_after=60)
  assert lock.stale(liveness.own_record()) == "its process is gone"


_RACER = """
import json, os, sys, time
from transformer_jax.hosts import liveness, workdir_lock
from transformer_jax.workdir import Workdir
root, start, rounds, spacing = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
outcomes = []
for r in range(rounds):
  lock = workdir_lock.WorkdirLock(Workdir(os.path.join(root, str(r))), stale_after=60)
  while time.time() < start + spacing * r:  # Both racers start each round at the same moment.
    pass
  try:
    lock.acquire(liveness.own_record())
    outcomes.append(os.getpid())
  except workdir_lock.WorkdirInUseError:
    outcomes.append(None)
print(json.dumps(outcomes))
"""


@pytest.mark.slow
def test_of_two_runs_taking_over_a_stale_lock_at_once_exactly_one_gets_it(root):
  """On a file system by renames and hard links; in the bucket by the server's preconditions on
  the generation read (each round there takes several requests to a server that answers one at
  a time, hence fewer, wider-spaced rounds)."""
  rounds, spacing = (80, 0.05) if not fileio.is_url(root) else (30, 0.25)
  for r in range(rounds):
    _write_lock(
      f"{root}/{r}", {"host": "elsewhere", "pid": 1, "since": 0, "time": time.time() - 100}
    )
  start = time.time() + 5  # After both have imported the package.
  racers = [
    subprocess.Popen(
      [sys.executable, "-c", _RACER, root, str(start), str(rounds), str(spacing)],
      stdout=subprocess.PIPE,
      text=True,
      cwd=REPO,
    )
    for _ in range(2)
  ]
  outcomes = [json.loads(racer.communicate(timeout=120)[0]) for racer in racers]
  for r, pair in enumerate(zip(*outcomes)):
    winners = [pid for pid in pair if pid is not None]
    assert len(winners) == 1, (r, pair)
    assert liveness.read_record(f"{root}/{r}/lock.json")["pid"] == winners[0]
    names = [path.name for path in epath.Path(root, str(r)).iterdir()]
    assert names == ["lock.json"]  # Nothing left aside.


def _current(path: str) -> dict:
  """The record at `path`, read again while it reads as None (being replaced: in the bucket, a
  reader may ask for the generation that a beat has just replaced)."""
  for _ in range(100):
    record = liveness.read_record(path)
    if record is not None:
      return record
    time.sleep(0.01)
  raise AssertionError(f"{path} stayed unreadable")


def test_the_refresh_stops_when_another_run_holds_the_lock(root, caplog):
  lock = workdir_lock.WorkdirLock(Workdir(root), stale_after=60)
  record = liveness.own_record()
  lock.acquire(record)
  other = {"host": "elsewhere", "pid": 7, "since": 1.0, "time": time.time()}
  with caplog.at_level(logging.ERROR), lock.heartbeat(record, interval=0.02) as beating:
    first = _current(lock.path)["time"]  # Written on entering.
    time.sleep(0.3)
    assert _current(lock.path)["time"] > first  # Refreshed by the beats.
    liveness.write_record(lock.path, other)  # Another run took it over.
    time.sleep(0.3)
    assert beating.lost == {lock.path}  # Seen by the beats, before the block ends.
  assert liveness.read_record(lock.path) == other
  assert f"{lock.path} no longer names this run (host elsewhere, pid 7" in caplog.text
  lock.release(record)
  assert liveness.read_record(lock.path) == other  # Not this run's to remove.


def test_a_lock_removed_from_a_bucket_stops_its_refresh(bucket_dir, caplog):
  """A lock appears whole in a bucket, so a missing one was removed (by hand, or by a run that
  took it over and ended): the run that held it says so instead of refreshing nothing."""
  lock = workdir_lock.WorkdirLock(Workdir(bucket_dir), stale_after=60)
  record = liveness.own_record()
  lock.acquire(record)
  with caplog.at_level(logging.ERROR), lock.heartbeat(record, interval=0.02) as beating:
    epath.Path(lock.path).unlink()
    time.sleep(0.3)
    assert beating.lost == {lock.path}
  assert f"{lock.path} was removed: this run no longer refreshes it" in caplog.text


def test_a_lock_in_a_store_that_does_not_answer_is_one_error_line(monkeypatch):
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://localhost:{helpers.free_port()}")
  lock = workdir_lock.WorkdirLock(Workdir("gs://tjtest/nowhere"), stale_after=60)
  started = time.monotonic()
  with pytest.raises(UserError, match=r"^gs://tjtest/nowhere/lock.json: cannot read the lock: "):
    lock.acquire(liveness.own_record())
  assert time.monotonic() - started < 30  # Its retries end well within a lock's staleness.
