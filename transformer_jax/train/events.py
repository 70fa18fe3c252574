"""TensorBoard event files of scalars, written without protobuf, TensorFlow or PyTorch.

An event file is a sequence of records: the little-endian uint64 length of
the data, its masked CRC-32C, the data (one serialized `tensorflow.Event`
protocol buffer), and the data's masked CRC-32C. The few fields written here
are encoded by hand, so a run imports neither TensorFlow nor PyTorch:

  Event:      wall_time = 1 (double), step = 2 (int64), file_version = 3 (string),
              summary = 5 (Summary), session_log = 7 (SessionLog)
  Summary:    value = 1 (repeated Value)
  Value:      tag = 1 (string), simple_value = 2 (float)
  SessionLog: status = 1 (enum; START = 1)
"""

import logging
import math
import os
import queue
import socket
import struct
import threading
import time

from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import first_line

log = logging.getLogger(__name__)


def _crc32c_table() -> tuple[int, ...]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # The reflected Castagnoli polynomial.
    table.append(crc)
  return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """The CRC-32C (Castagnoli) checksum of `data`."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """The checksum as TFRecord files store it: rotated right by 15 bits, plus a constant."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """One TFRecord: length, its masked checksum, the data, its masked checksum."""
  length = struct.pack("<Q", len(data))
  return (
    length
    + struct.pack("<I", masked_crc32c(length))
    + data
    + struct.pack("<I", masked_crc32c(data))
  )


def _varint(value: int) -> bytes:
  out = bytearray()
  while True:
    low, value = value & 0x7F, value >> 7
    out.append(low | (0x80 if value else 0))
    if not value:
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited field (wire type 2): a string or a nested message."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
  """`value` as a little-endian float32; beyond its range an infinity, as protobuf stores it."""
  try:
    return struct.pack("<f", value)
  except OverflowError:
    return struct.pack("<f", math.copysign(math.inf, value))


def event(
  wall_time: float,
  step: int = 0,
  *,
  file_version: str = "",
  tag: str = "",
  value: float = 0.0,
  session_start: bool = False,
) -> bytes:
  """A serialized `Event` of one kind: a file version, a scalar `tag` = `value`, or a session
  start."""
  if step < 0:
    raise ValueError(f"step {step} is negative")
  if sum(map(bool, (file_version, tag, session_start))) != 1:
    raise ValueError("an event holds exactly one of file_version, tag and session_start")
  out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
  if file_version:
    out += _field(3, file_version.encode())
  if tag:
    scalar = _field(1, tag.encode()) + b"\x15" + _float32(value)
    out += _field(5, _field(1, scalar))
  if session_start:
    out += _field(7, b"\x08\x01")
  return out


def _version(wall_time: float, step: int) -> bytes:
  """The record that starts every event file."""
  return record(event(wall_time, step, file_version="brain.Event:2"))


def _appends(directory: str) -> bool:
  """Whether files in `directory` can be appended to: local paths yes, URLs (gs://) no."""
  return not fileio.is_url(directory)


# At a URL, the size at which an event file is left for a new one: each flush rewrites the file
# whole (object stores do not append), so one flush sends at most this and its own events.
ROLLOVER_BYTES = 1 << 20


class EventWriter:
  """Writes scalar events to a new event file in `directory` (a local path or a URL such as
  gs://).

  With `purge_step`, the file starts with a session start at that step, which
  tells TensorBoard to hide the events of earlier files at that step and
  later (those of a run that stopped after its last checkpoint). Events reach
  the file at `flush`: appended to a local file; at a URL (object stores do
  not append) the whole file is rewritten until it holds `ROLLOVER_BYTES`,
  then the next events go to a new file whose name sorts after it (`.00001`,
  ...), which TensorBoard reads next. Those uploads run in a thread of their
  own (`_Uploads`), so that a flush never waits on the store; `close` waits
  for them.
  """

  def __init__(self, directory: str, *, purge_step: int | None = None):
    epath.Path(directory).mkdir(parents=True, exist_ok=True)
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
    self.path = self._first_path = os.path.join(directory, name)
    self._local = _appends(directory)
    self._uploads = None if self._local else _Uploads()
    self._pending, self._written, self._files = bytearray(), bytearray(), 1
    now = time.time()
    self._pending += _version(now, purge_step or 0)
    if purge_step is not None:
      self._pending += record(event(now, purge_step, session_start=True))
    self.flush()

  def scalar(self, tag: str, value: float, step: int):
    """Add `tag` = `value` at `step`, written at the next `flush`."""
    self._pending += record(event(time.time(), step, tag=tag, value=float(value)))

  def flush(self):
    """Write the events so far."""
    if not self._pending:
      return
    if self._local:
      with open(self.path, "ab") as f:
        f.write(self._pending)
    else:
      self._written += self._pending
      self._uploads.submit(self.path, bytes(self._written))
      if len(self._written) >= ROLLOVER_BYTES:
        self.path = f"{self._first_path}.{self._files:05d}"
        self._files += 1
        self._written = bytearray(_version(time.time(), 0))
    self._pending.clear()

  def close(self):
    """Write what is pending, and wait for the uploads; the writer keeps no file open."""
    self.flush()
    if self._uploads is not None:
      self._uploads.close()


class _Uploads:
  """Whole-file uploads in one background thread, in the order they were asked for; one that a
  later upload of the same file supersedes before it starts is skipped, and one that fails is
  tried once more, then logged. The thread is a daemon, so a hung upload cannot keep the process
  alive: `close` waits for the queue at most `timeout` seconds."""

  def __init__(self, timeout: float = 60.0):
    self._queue: queue.Queue = queue.Queue()
    self._lock = threading.Lock()
    self._newest: dict[str, int] = {}  # path -> the number of its newest upload
    self._timeout = timeout
    self._thread = threading.Thread(target=self._run, name="event_uploads", daemon=True)
    self._thread.start()

  def submit(self, path: str, data: bytes) -> None:
    with self._lock:
      number = self._newest[path] = self._newest.get(path, 0) + 1
    self._queue.put((path, data, number))

  def _run(self) -> None:
    while (item := self._queue.get()) is not None:
      path, data, number = item
      with self._lock:
        if number != self._newest[path]:
          continue
      for attempt in range(2):
        try:
          fileio.write_atomically(path, data)
          break
        except Exception as error:  # The run goes on; only its log is late.
          if attempt:
            log.warning("could not write the event file %s: %s", path, first_line(error))

  def close(self) -> None:
    self._queue.put(None)
    self._thread.join(self._timeout)
    if self._thread.is_alive():
      log.warning(
        "the event files' uploads did not end within %.0f s: their last events may be missing",
        self._timeout,
      )
