"""The files of the decode modes: lines in and out as UTF-8, JSON records; hand-written bytes."""

import io
import json
import sys

import pytest

from transformer_jax.decode import files
from transformer_jax.errors import UserError


def test_read_lines_splits_at_newlines_only(tmp_path):
  path = tmp_path / "in.txt"
  cases = {b"": [], b"a\n": ["a"], b"a": ["a"], b"\n": [""], b"a\n\nb c\r\n": ["a", "", "b c\r"],
           "é ü\n".encode(): ["é ü"]}
  for raw, lines in cases.items():
    path.write_bytes(raw)
    assert files.read_lines(str(path)) == lines, raw


def test_read_lines_names_the_first_line_that_is_not_utf8(tmp_path):
  path = tmp_path / "in.txt"
  path.write_bytes(b"fine\n\nstill fine\nbad \xff byte\n\xfe too\n")
  with pytest.raises(UserError, match=r"line 4: not valid UTF-8 \(byte 0xff at byte 5"):
    files.read_lines(str(path))
  with pytest.raises(UserError, match="cannot read the input"):
    files.read_lines(str(tmp_path / "missing.txt"))


def test_write_lines_ends_every_line(tmp_path):
  path = tmp_path / "sub" / "out.txt"
  files.write_lines(str(path), ["a", "", "ü"])
  assert path.read_bytes() == "a\n\nü\n".encode()


@pytest.mark.parametrize("name", [None, "-"])
def test_none_or_a_dash_is_stdin_and_stdout_as_utf8_bytes(monkeypatch, name):
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a\n\né\n".encode())))
  assert files.read_lines(name) == ["a", "", "é"]
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xff\n")))
  with pytest.raises(UserError, match="line 2: not valid UTF-8"):
    files.read_lines(name)
  out = io.BytesIO()
  monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(out))
  files.write_lines(name, ["x", "ü"])
  assert out.getvalue() == "x\nü\n".encode()


def test_write_json_makes_the_directory_and_indents(tmp_path):
  path = tmp_path / "eval" / "record.json"
  files.write_json(str(path), {"bleu": 96.5, "split": "test"})
  assert json.loads(path.read_text()) == {"bleu": 96.5, "split": "test"}
  assert path.read_text().endswith("\n") and '\n  "bleu": 96.5' in path.read_text()
