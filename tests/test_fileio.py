"""A file written atomically is whole: the old content or the new, never a part or a leftover."""

import os

from etils import epath
import pytest

from transformer_jax import fileio


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
  assert all(os.path.dirname(n) == str(tmp_path) and os.path.basename(n).startswith(".lock.json.")
             for n in names)
