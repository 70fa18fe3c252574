"""TensorBoard event files against tensorboardX's protocol buffers and checksums."""

import threading

import numpy as np
import pytest
from etils import epath
from tensorboardX import record_writer
from tensorboardX.proto import event_pb2, summary_pb2

import helpers
from transformer_jax.train import events


def _records(path) -> list[bytes]:
  """The data of each record of a TFRecord file, its two checksums verified by tensorboardX's."""
  return helpers.tfrecords(path, record_writer.masked_crc32c)


def test_crc32c_has_the_standard_check_value_and_equals_tensorboardx():
  assert events.crc32c(b"123456789") == 0xE3069283
  rng = np.random.default_rng(0)
  for size in (0, 1, 7, 64, 1000):
    data = rng.bytes(size)
    assert events.masked_crc32c(data) == record_writer.masked_crc32c(data)


@pytest.mark.parametrize("step", [0, 1, 127, 128, 300_000, 2**40])
def test_an_event_parses_as_the_protocol_buffer_it_encodes(step):
  scalar = event_pb2.Event.FromString(events.event(1.5, step, tag="train/lös", value=-0.1))
  assert scalar == event_pb2.Event(
    wall_time=1.5,
    step=step,
    summary=summary_pb2.Summary(
      value=[summary_pb2.Summary.Value(tag="train/lös", simple_value=-0.1)]
    ),
  )
  start = event_pb2.Event.FromString(events.event(2.0, step, session_start=True))
  assert start == event_pb2.Event(
    wall_time=2.0, step=step, session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)
  )
  with pytest.raises(ValueError, match="negative"):
    events.event(0.0, -1, tag="a")
  with pytest.raises(ValueError, match="exactly one of"):
    events.event(0.0, step, tag="a", session_start=True)
  with pytest.raises(ValueError, match="exactly one of"):
    events.event(0.0, step)


@pytest.mark.parametrize("value", [1e39, -1e300, float("inf"), float("nan"), 3.4e38])
def test_a_scalar_is_stored_as_protobuf_stores_a_float(value):
  read = event_pb2.Event.FromString(events.event(0.0, 1, tag="a", value=value))
  expected = event_pb2.Event(
    summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="a", simple_value=value)])
  )
  np.testing.assert_array_equal(
    read.summary.value[0].simple_value, expected.summary.value[0].simple_value
  )


@pytest.mark.parametrize("appends", [True, False])
def test_a_writer_starts_with_the_version_and_the_purge_then_writes_scalars_at_flush(
  tmp_path, monkeypatch, appends
):
  monkeypatch.setattr(events, "_appends", lambda directory: appends)  # False: as at gs://.
  writer = events.EventWriter(str(tmp_path / "tensorboard"), purge_step=4)
  writer.scalar("train/loss", np.float32(2.5), 5)
  if appends:  # At a URL the upload runs in the background: the file is read after `close`.
    (path,) = (tmp_path / "tensorboard").iterdir()
    assert path.name.startswith("events.out.tfevents.") and len(_records(path)) == 2
  writer.flush()
  writer.scalar("eval_valid/bleu", 31.25, 6)
  writer.close()
  (path,) = (tmp_path / "tensorboard").iterdir()
  assert path.name.startswith("events.out.tfevents.")
  read = [event_pb2.Event.FromString(data) for data in _records(path)]
  assert read[0].file_version == "brain.Event:2" and read[0].step == 4
  assert read[1].session_log.status == event_pb2.SessionLog.START and read[1].step == 4
  assert [(e.step, v.tag, v.simple_value) for e in read[2:] for v in e.summary.value] == [
    (5, "train/loss", 2.5),
    (6, "eval_valid/bleu", 31.25),
  ]
  assert helpers.scalars(tmp_path) == {5: 2.5}


def test_a_writer_without_a_purge_step_starts_with_the_version_alone(tmp_path):
  events.EventWriter(str(tmp_path)).close()
  (path,) = tmp_path.iterdir()
  (version,) = [event_pb2.Event.FromString(data) for data in _records(path)]
  assert version.file_version == "brain.Event:2" and version.step == 0
  assert not version.HasField("session_log")


def test_in_a_bucket_a_full_event_file_is_left_for_the_next_in_order(bucket_dir, monkeypatch):
  monkeypatch.setattr(events, "ROLLOVER_BYTES", 200)
  directory = f"{bucket_dir}/tensorboard"
  writer = events.EventWriter(directory, purge_step=0)
  for step in range(1, 13):
    writer.scalar("train/loss", float(step), step)
    writer.flush()
  writer.close()
  files = sorted(epath.Path(directory).iterdir())  # In the order TensorBoard reads them.
  assert len(files) >= 3 and files[1].name == files[0].name + ".00001"
  scalar = len(events.record(events.event(0.0, 12, tag="train/loss", value=12.0)))
  sizes = [f.stat().length for f in files]
  assert all(200 <= size < 200 + scalar for size in sizes[:-1]), sizes
  steps, versions = [], 0
  for path in files:
    records = helpers.tfrecords_of(path.read_bytes(), record_writer.masked_crc32c)
    read = [event_pb2.Event.FromString(data) for data in records]
    versions += read[0].file_version == "brain.Event:2"
    steps += [e.step for e in read if e.summary.value]
  assert versions == len(files) and steps == list(range(1, 13))


def test_at_a_url_a_flush_never_waits_for_the_store(tmp_path, monkeypatch):
  monkeypatch.setattr(events, "_appends", lambda directory: False)  # As at gs://.
  release, uploads = threading.Event(), []

  def blocked_upload(path, data):
    assert release.wait(30), "a flush waited for the store"  # Not released: flushes blocked.
    uploads.append(data)

  monkeypatch.setattr(events.fileio, "write_atomically", blocked_upload)
  writer = events.EventWriter(str(tmp_path), purge_step=0)
  for step in range(1, 6):
    writer.scalar("train/loss", float(step), step)
    writer.flush()
  assert not uploads  # Every flush returned while the first upload was held.
  release.set()
  writer.close()
  assert len(uploads) < 6  # Those superseded while the first was held were skipped.
  read = [event_pb2.Event.FromString(data) for data in helpers.tfrecords_of(uploads[-1])]
  assert [e.step for e in read if e.summary.value] == [1, 2, 3, 4, 5]
