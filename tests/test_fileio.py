"""Files: one written atomically is whole (the old content or the new, never a part or a leftover);
lines in and out as UTF-8 and JSON records, on hand-written bytes."""

import io
import json
import logging
import os
import socket
import sys
import time

import pytest
from etils import epath

from transformer_jax import fileio
from transformer_jax.errors import UserError


def test_writes_text_and_bytes_over_the_old_file_making_its_directory(tmp_path):
  path = tmp_path / "new" / "record.json"
  fileio.write_atomically(str(path), "first ü")
  assert path.read_text(encoding="utf-8") == "first ü"
  fileio.write_atomically(str(path), b"\x00second")
  assert path.read_bytes() == b"\x00second"
  assert os.listdir(path.parent) == ["record.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
  path = tmp_path / "record.json"
  path.write_text("old")

  def failing_replace(self, target):
    raise OSError("disk full")

  monkeypatch.setattr(type(epath.Path(str(tmp_path))), "replace", failing_replace)
  with pytest.raises(OSError, match="disk full"):
    fileio.write_atomically(str(path), "new")
  assert path.read_text() == "old" and os.listdir(tmp_path) == ["record.json"]


def test_temporary_names_are_hidden_beside_the_file_and_never_repeat(tmp_path):
  names = {fileio.temporary_name(str(tmp_path / "lock.json")) for _ in range(100)}
  assert len(names) == 100
  assert all(
    os.path.dirname(n) == str(tmp_path) and os.path.basename(n).startswith(".lock.json.")
    for n in names
  )


def test_read_lines_splits_at_newlines_only(tmp_path):
  path = tmp_path / "in.txt"
  cases = {
    b"": [],
    b"a\n": ["a"],
    b"a": ["a"],
    b"\n": [""],
    b"a\n\nb c\r\n": ["a", "", "b c\r"],
    "é ü\n".encode(): ["é ü"],
  }
  for raw, lines in cases.items():
    path.write_bytes(raw)
    assert fileio.read_lines(str(path)) == lines, raw


def test_read_lines_names_the_first_line_that_is_not_utf8(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"fine\n\nstill fine\nbad \xff byte\n\xfe too\n")
  with pytest.raises(UserError, match=r"line 4: not valid UTF-8 \(byte 0xff at byte 5"):
    fileio.read_lines(str(path))
  with pytest.raises(UserError, match="cannot read the input"):
    fileio.read_lines(str(tmp_path / "missing.txt"))


def test_write_lines_ends_every_line(tmp_path):
  path = tmp_path / "sub" / "out.txt"
  fileio.write_lines(str(path), ["a", "", "ü"])
  assert path.read_bytes() == "a\n\nü\n".encode()


@pytest.mark.parametrize("name", [None, "-"])
def test_none_or_a_dash_is_stdin_and_stdout_as_utf8_bytes(monkeypatch, name):
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a\n\né\n".encode())))
  assert fileio.read_lines(name) == ["a", "", "é"]
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xff\n")))
  with pytest.raises(UserError, match="line 2: not valid UTF-8"):
    fileio.read_lines(name)
  out = io.BytesIO()
  monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out))
  fileio.write_lines(name, ["x", "ü"])
  assert out.getvalue() == "x\nü\n".encode()


def test_write_json_makes_the_directory_and_indents(tmp_path):
  path = tmp_path / "eval" / "record.json"
  fileio.write_json(str(path), {"bleu": 96.5, "split": "test"})
  assert json.loads(path.read_text()) == {"bleu": 96.5, "split": "test"}
  assert path.read_text().endswith("\n") and '\n  "bleu": 96.5' in path.read_text()


def test_read_json_reads_back_what_write_json_wrote_in_utf8(tmp_path):
  path = tmp_path / "record.json"
  record = {"hypothesis": "ein Hund läuft über die Wiese", "steps": [1, 2]}
  fileio.write_json(path, record)
  assert "läuft" in path.read_text(encoding="utf-8")  # Not escaped.
  assert fileio.read_json(path) == fileio.read_json(str(path)) == record


def test_read_json_of_a_missing_file_is_missing_if_given_else_one_clear_error(tmp_path):
  path = tmp_path / "absent.json"
  assert fileio.read_json(path, missing=None) is None
  assert fileio.read_json(path, missing={}) == {}
  with pytest.raises(UserError, match=r"cannot read .*absent.json: no such file"):
    fileio.read_json(path)


@pytest.mark.parametrize(
  "content, message",
  [(b'{"step": 4', r"broken.json is not valid JSON: "), (b"\xff\xfe{}", r"cannot read .*broken")],
)
def test_read_json_of_a_broken_file_names_it(tmp_path, content, message):
  path = tmp_path / "broken.json"
  path.write_bytes(content)
  with pytest.raises(UserError, match=message):
    fileio.read_json(path, missing=None)


def test_write_json_is_process_zeros_unless_every_process_writes(tmp_path, monkeypatch):
  monkeypatch.setattr(fileio.jax, "process_index", lambda: 1)
  fileio.write_json(tmp_path / "a.json", {"x": 1})
  fileio.write_json(tmp_path / "b.json", {"x": 2}, every_process=True)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


@pytest.fixture(params=["local", "gs"])
def directory(request, tmp_path):
  """A local directory, or one in the bucket of the storage server the tests start."""
  return str(tmp_path) if request.param == "local" else request.getfixturevalue("bucket_dir")


def test_json_lines_and_whole_writes_in_a_directory_or_a_bucket(directory):
  fileio.write_json(f"{directory}/run/record.json", {"bleu": 41.2, "hyp": "über"})
  assert fileio.read_json(f"{directory}/run/record.json") == {"bleu": 41.2, "hyp": "über"}
  assert fileio.read_json(f"{directory}/run/absent.json", missing=None) is None
  fileio.write_atomically(f"{directory}/run/record.json", b'{"bleu": 42.0}')
  assert fileio.read_json(f"{directory}/run/record.json") == {"bleu": 42.0}
  fileio.write_lines(f"{directory}/out/hyp.txt", ["ein hund", "zwei katzen"])
  assert fileio.read_lines(f"{directory}/out/hyp.txt") == ["ein hund", "zwei katzen"]
  names = sorted(p.name for p in epath.Path(directory).glob("*/*"))
  assert names == ["hyp.txt", "record.json"]  # Nothing left beside them.


def test_is_file_is_a_file_or_an_object_of_that_name_not_a_directory_nor_a_prefix(directory):
  fileio.write_lines(f"{directory}/run/sub/a.txt", ["a"])
  assert fileio.is_file(f"{directory}/run/sub/a.txt")
  assert not fileio.is_file(f"{directory}/run/sub")  # In a bucket: a prefix with an object.
  assert not fileio.is_file(f"{directory}/run")
  assert not fileio.is_file(f"{directory}/absent")


def test_is_file_looks_once_so_a_vanishing_object_cannot_make_a_directory_a_file(
  bucket_dir, monkeypatch
):
  """Another process's object under the directory, removed after the first lookup: etils'
  `exists() and not is_dir()` then saw a file (the README pod test failed so, rarely)."""
  import fsspec  # pylint: disable=import-outside-toplevel

  fileio.write_lines(f"{bucket_dir}/run/probe", [""])
  store, _ = fsspec.url_to_fs(bucket_dir)
  # Patched on the class: etils keeps a filesystem of its own (other options), of this class.
  info = type(store)._info  # pylint: disable=protected-access  # What every sync call awaits.
  probe = f"{store._strip_protocol(bucket_dir)}/run/probe"  # pylint: disable=protected-access
  removed = []

  async def info_then_remove_the_probe(self, path, **kwargs):
    answer = await info(self, path, **kwargs)
    if not removed:
      await self._rm_file(probe)  # pylint: disable=protected-access
      removed.append(probe)
    return answer

  monkeypatch.setattr(type(store), "_info", info_then_remove_the_probe)
  assert not fileio.is_file(f"{bucket_dir}/run")
  assert removed  # The store was asked, and the probe is gone.


def test_absolute_keeps_a_url_and_anchors_a_local_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert fileio.absolute("gs://b/run") == "gs://b/run"
  assert fileio.absolute("run") == os.path.join(str(tmp_path), "run")


def test_a_usable_bucket_passes_the_check_and_keeps_nothing_of_it(bucket_dir):
  fileio.check_store(f"{bucket_dir}/run")
  assert not epath.Path(bucket_dir).exists()  # No object under it: the probe was removed.


def test_a_missing_bucket_is_one_line_naming_it(gcs_server):
  with pytest.raises(UserError, match=r"gs://nobucket/run: no such bucket, or this account"):
    fileio.check_store("gs://nobucket/run")


def test_a_caller_without_credentials_is_one_line_saying_how_to_sign_in(gcs_server, caplog):
  # Every request for this bucket answers 401, as the service answers an anonymous caller:
  # gcsfs raises its HttpError (code 401, the service's message then ", 401") and logs it, with
  # its traceback, at ERROR.
  with pytest.raises(UserError) as refused:
    fileio.check_store("gs://tjtest-noauth/run")
  line = str(refused.value)
  assert "\n" not in line and ", 401" not in line, line
  assert line.startswith(
    "gs://tjtest-noauth/run: the storage service found no credentials it accepts (Anonymous "
    "caller does not have storage.objects.create access"
  ), line
  assert line.endswith(
    "sign in with gcloud auth application-default login, or set "
    "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file"
  ), line
  assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # The line says it all.


def test_a_bucket_one_may_only_read_is_one_line_saying_what_permission_to_get(gcs_server):
  assert not epath.Path("gs://tjtest-readonly/run").exists()  # Reads and listings are allowed.
  # Its writes answer 403: gcsfs raises an OSError "Forbidden: <request URL>\n<message>".
  with pytest.raises(UserError) as refused:
    fileio.check_store("gs://tjtest-readonly/run")
  line = str(refused.value)
  assert "\n" not in line and "Forbidden" not in line and "localhost" not in line, line
  assert line.startswith(
    "gs://tjtest-readonly/run: no permission to write there (reader@tjtest.iam.gserviceaccount"
    ".com does not have storage.objects.create access to the Google Cloud Storage object."
  ), line
  assert line.endswith(
    "give this account a role that may create and delete objects in the bucket (e.g. "
    "roles/storage.objectUser), or use other credentials (GOOGLE_APPLICATION_CREDENTIALS) or "
    "another bucket"
  ), line


def test_a_server_that_does_not_answer_is_one_line_within_the_timeout(bucket_dir, monkeypatch):
  with socket.socket() as silent:  # It takes connections and never answers.
    silent.bind(("localhost", 0))
    silent.listen()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://localhost:{silent.getsockname()[1]}")
    start = time.monotonic()
    with pytest.raises(UserError, match=r"did not answer within 2 s: check the network"):
      fileio.check_store(f"{bucket_dir}/run", timeout=2)
    assert time.monotonic() - start < 10


def test_a_listing_in_a_bucket_shows_what_another_client_wrote_since(bucket_dir):
  """gcsfs would answer a second listing from its cache; an object written meanwhile by another
  client (TensorStore, for Orbax's checkpoints; another process) must show."""
  import tensorstore as ts  # pylint: disable=import-outside-toplevel

  epath.Path(f"{bucket_dir}/a").write_text("a")
  assert [p.name for p in epath.Path(bucket_dir).iterdir()] == ["a"]
  ts.KvStore.open(f"{bucket_dir}/").result().write("b", b"b").result()
  assert sorted(p.name for p in epath.Path(bucket_dir).iterdir()) == ["a", "b"]


def test_listing_afresh_is_set_by_whoever_runs_the_process_and_keeps_their_setting(monkeypatch):
  """Importing the library leaves fsspec as it was (tests/test_process_state.py); the command
  line, the tests' GCS server and a program of one's own turn gcsfs's listings cache off."""
  fsspec = pytest.importorskip("fsspec")
  monkeypatch.setattr(fsspec.config, "conf", {})
  fileio.list_stores_afresh()
  assert fsspec.config.conf == {"gs": {"use_listings_cache": False}}
  monkeypatch.setattr(fsspec.config, "conf", {"gs": {"use_listings_cache": True, "token": "x"}})
  fileio.list_stores_afresh()
  assert fsspec.config.conf == {"gs": {"use_listings_cache": True, "token": "x"}}
