"""The source 'text': the user's files `<prefix>.<lang>` (one sentence per line), converted once
into ArrayRecord (`parallel_text.py`). Any two languages: the file suffixes. The prefixes are
`data.source.text_train`, `data.source.text_validation` and `data.source.text_test` (local paths
or URLs such as gs://); a missing file names its field.

Lines end at '\n' or '\r\n', the last one may lack it, and a UTF-8 byte-order mark at the start
of a file is dropped. Missing or empty files, files of different line counts and two identical
files are errors; a line pair with bytes that are not UTF-8, with a line over
`parallel_text.MAX_LINE_BYTES` bytes, or with a side that is empty (or only white space) is
skipped at conversion, and the skips are counted and logged with their line numbers.
"""

import hashlib

from etils import epath

from transformer_jax import fileio
from transformer_jax.data import parallel_text
from transformer_jax.data.source import Source
from transformer_jax.errors import FieldError


def builder(c):
  """`Source.builder`: the parallel text of the prefixes of `c`."""
  languages = tuple(sorted((c.source_lang, c.target_lang)))
  files = {}
  for split, prefix in (
    ("train", c.text_train),
    ("validation", c.text_validation),
    ("test", c.text_test),
  ):
    if not prefix:
      continue
    base = fileio.absolute(prefix)
    paths = tuple(f"{base}.{lang}" for lang in languages)
    for p in paths:
      if not epath.Path(p).is_file():
        found = _names_starting(f"{base}.")
        raise FieldError(
          "data.source",
          f"text_{split}",
          f"={prefix!r}: no file {p} (expected "
          "<prefix>.<lang> for data.source.source_lang and data.source.target_lang; "
          f"{'found ' + ', '.join(found) if found else 'no <prefix>.* exists'}).",
        )
    files[split] = paths
  return parallel_text.builder(files, languages, c.data_dir)


def _names_starting(start: str) -> list[str]:
  """The paths (sorted) in the directory of `start` (a path or a URL) whose names begin with
  the last part of `start` (the files `<prefix>.*` for `<prefix>.`)."""
  start = epath.Path(start)
  try:
    entries = list(start.parent.iterdir())
  except OSError:  # Missing, not a directory, or not readable: nothing to list.
    return []
  return sorted(str(entry) for entry in entries if entry.name.startswith(start.name))


def check_split(c, split, stored):
  """`Source.check_split`: FieldError for an evaluation split whose prefix is not set."""
  del stored
  if split in ("validation", "test") and not getattr(c, f"text_{split}"):
    raise FieldError(
      "data.source",
      f"text_{split}",
      f"={getattr(c, f'text_{split}')!r}: there is "
      f"no {split} split to read; set it to the prefix of the {split} files "
      "(or evaluate another split: data.source.eval_split, decode.split).",
    )


def vocab_key(c) -> str:
  """`Source.vocab_key`: the training files' prefix, hashed."""
  return "_" + hashlib.sha1(fileio.absolute(c.text_train).encode()).hexdigest()[:8]


SOURCE = Source(
  "text",
  None,
  builder,
  parallel_text.prepare,
  splits=None,  # Those whose prefixes are set.
  check_split=check_split,
  needs={"text_train": "a path prefix (files <prefix>.<lang>)"},
  vocab_key=vocab_key,
)
