"""Parallel text files as a TFDS dataset prepared as ArrayRecord: line i of one file translates
line i of the other. The 'text' source and Multi30k are made of them; a file ending in .gz is
read through gzip. The files may be local or in a bucket (a URL such as gs://)."""

import codecs
import contextlib
import gzip
import hashlib
import io
import logging
import os

import tensorflow_datasets as tfds
from etils import epath

from transformer_jax import fileio
from transformer_jax.data import tfds_prepare
from transformer_jax.data.errors import DataError

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 16_384  # Far beyond any sentence; longer lines are not sentences.


@contextlib.contextmanager
def open_lines(path: str):
  """The file at `path` (a local path or a URL) for reading bytes line by line, decompressed
  when it ends in .gz."""
  with epath.Path(path).open("rb") as opened:
    # A store's file object (gcsfs) makes each small read slow: 266 s for the lines of a 6.6 MB
    # file from the tests' server, 0.05 s read a MiB at a time (4 s and 0.1 s gzipped; the 2-core
    # development VM, 2026-11-26).
    file = io.BufferedReader(opened, buffer_size=1 << 20) if fileio.is_url(path) else opened
    if path.endswith(".gz"):
      with gzip.GzipFile(fileobj=file, mode="rb") as unzipped:
        yield unzipped
    else:
      yield file


def size_and_time(path: str) -> tuple:
  """(size in bytes, modification time) of the file at `path`: whether it changed since."""
  if fileio.is_url(path):
    stat = epath.Path(path).stat()
    return stat.length, stat.mtime
  # The time with its fraction of a second (epath gives whole seconds), as before URLs were read:
  # the datasets already prepared from local files keep their names.
  return os.path.getsize(path), os.path.getmtime(path)


class ParallelTextConfig(tfds.core.BuilderConfig):
  """The files of a dataset: {split: (file of lang_a, file of lang_b)}."""

  def __init__(self, *, files, languages):
    identity = repr(
      (
        sorted(files.items()),
        languages,
        [size_and_time(p) for pair in files.values() for p in pair],
      )
    )
    super().__init__(
      name=hashlib.sha1(identity.encode()).hexdigest()[:16], version=tfds.core.Version("1.1.0")
    )  # 1.1: BOM dropped, empty sides skipped
    self.files = files
    self.languages = languages


class TransformerJaxParallelText(tfds.core.GeneratorBasedBuilder):
  """Plain parallel text files (line i of one file translates line i of the other)."""

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Parallel text files: " + repr(self.builder_config.files),
      features=tfds.features.Translation(languages=self.builder_config.languages),
      disable_shuffling=True,
    )  # keep the file order

  def _split_generators(self, dl_manager):
    del dl_manager
    return {
      split: self._generate_examples(paths) for split, paths in self.builder_config.files.items()
    }

  def _generate_examples(self, paths):
    lang_a, lang_b = self.builder_config.languages
    too_long = f"with a line over {MAX_LINE_BYTES} bytes"
    skipped = {too_long: [], "not UTF-8": [], "with an empty side": []}
    kept = 0
    with open_lines(paths[0]) as fa, open_lines(paths[1]) as fb:  # lines end at \n only
      for i, (a, b) in enumerate(zip(fa, fb, strict=True)):
        if i == 0:
          a, b = a.removeprefix(codecs.BOM_UTF8), b.removeprefix(codecs.BOM_UTF8)
        if max(len(a), len(b)) > MAX_LINE_BYTES:
          skipped[too_long].append(i + 1)
          continue
        try:
          texts = a.decode("utf-8").rstrip("\r\n"), b.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
          skipped["not UTF-8"].append(i + 1)
          continue
        if not (texts[0].strip() and texts[1].strip()):
          skipped["with an empty side"].append(i + 1)
          continue
        kept += 1
        yield i, {lang_a: texts[0], lang_b: texts[1]}
    for reason, lines in skipped.items():
      if lines:
        log.warning(
          "%s, %s: skipped %d line pairs %s (lines %s%s)",
          *paths,
          len(lines),
          reason,
          ", ".join(map(str, lines[:10])),
          ", ..." * (len(lines) > 10),
        )
    if not kept:
      raise DataError(f"{paths[0]}, {paths[1]}: no usable line pairs (see the warnings above).")


def builder(files: dict, languages: tuple[str, str], data_dir: str):
  """The (maybe not yet prepared) dataset of `files` ({split: (file of languages[0], file of
  languages[1])}) in `data_dir` ('' = TFDS's default)."""
  return TransformerJaxParallelText(
    config=ParallelTextConfig(files=files, languages=languages),
    data_dir=data_dir or None,
    file_format="array_record",
  )


def prepare(builder, c) -> bool:
  """`Source.prepare` of parallel text: unless converted, its files checked (`check_files`),
  then converted (`tfds_prepare.prepare`)."""
  del c
  if builder.is_prepared():
    return True
  for path_a, path_b in builder.builder_config.files.values():
    check_files(path_a, path_b)
  return tfds_prepare.prepare(builder)


def _digest_and_count(path):
  """(SHA-1 of the file's lines, its number of lines); DataError when it cannot be read."""
  digest, count = hashlib.sha1(), 0
  try:
    with open_lines(path) as f:
      for line in f:
        digest.update(line)
        count += 1
  except FileNotFoundError:
    raise DataError(f"cannot read {path}: no such file") from None
  except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError.
    raise DataError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
  return digest.digest(), count


def check_files(path_a, path_b):
  """DataError if a file of a pair is unreadable or empty, if their line counts differ, or if
  they are the same text."""
  contents = [_digest_and_count(path_a), _digest_and_count(path_b)]
  counts = [count for _, count in contents]
  for path, count in zip((path_a, path_b), counts):
    if not count:
      raise DataError(f"{path} is empty: parallel text holds one sentence per line.")
  if counts[0] != counts[1]:
    raise DataError(
      f"{path_a} has {counts[0]} lines but {path_b} has {counts[1]}: "
      "line i of one file must translate line i of the other."
    )
  if contents[0] == contents[1]:
    raise DataError(
      f"{path_a} and {path_b} are the same text: the file of each language "
      "must hold its own side of the translation."
    )
