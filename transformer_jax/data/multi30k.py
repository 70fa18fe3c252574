"""Multi30k (WMT16 multimodal task 1): image captions in en, de, fr, cs, read from a copy of
https://github.com/multi30k/dataset (`data.manual_dir`, the directory holding `data/task1`).

Two variants, chosen by `data.name`: 'multi30k' reads the cased text
`data/task1/raw/<file>.<lang>.gz`, 'multi30k_tok' the lowercased, normalized and
tokenized text `data/task1/tok/<file>.lc.norm.tok.<lang>`. The files of the two
languages of `data.source_lang` / `data.target_lang` are converted once into
ArrayRecord in `data.data_dir` (again when a file changes), like the 'text'
source. Nothing is downloaded.
"""

import codecs
import gzip
import hashlib
import os

import tensorflow_datasets as tfds

from transformer_jax.data.config import DataConfig
from transformer_jax.data.errors import DataError, DataUnavailableError

NAMES = ("multi30k", "multi30k_tok")
LANGUAGES = ("en", "de", "fr", "cs")
URL = "https://github.com/multi30k/dataset"

# split name -> (the file name of the repository, the languages it has)
_WMT17 = ("en", "de", "fr")  # the 2017 test sets have no Czech
SPLITS = {
    "train": ("train", LANGUAGES),
    "validation": ("val", LANGUAGES),
    "test_2016_flickr": ("test_2016_flickr", LANGUAGES),
    "test_2017_flickr": ("test_2017_flickr", _WMT17),
    "test_2017_mscoco": ("test_2017_mscoco", _WMT17),
    "test_2018_flickr": ("test_2018_flickr", LANGUAGES),
}
ALIASES = {"test": "test_2016_flickr"}


def relative_path(name: str, file: str, lang: str) -> str:
  """The path of one file of dataset `name` inside the repository."""
  if name == "multi30k_tok":
    return f"data/task1/tok/{file}.lc.norm.tok.{lang}"
  return f"data/task1/raw/{file}.{lang}.gz"


def stored_split(c: DataConfig, split: str) -> str:
  """The split of the prepared dataset that `split` names ('test' is test_2016_flickr);
  DataError if Multi30k has no such split, or not in both languages of `c`."""
  stored = ALIASES.get(split, split)
  if stored not in SPLITS:
    raise DataError(f"{c.name} has no split {split!r}: it has "
                    f"{' | '.join([*SPLITS, *ALIASES])}.")
  file, langs = SPLITS[stored]
  for lang in (c.source_lang, c.target_lang):
    if lang not in langs:
      have = [s for s, (_, ls) in SPLITS.items() if c.source_lang in ls and c.target_lang in ls]
      have += [alias for alias, target in ALIASES.items() if target in have]
      raise DataError(f"{c.name} has no {lang} text for split {split!r} (the repository's "
                      f"{file} is {', '.join(langs)} only): {c.source_lang}-{c.target_lang} "
                      f"has {' | '.join(have)} (data.train_split, data.eval_split, "
                      "decode.split).")
  return stored


def _expected_files(c: DataConfig, root: str) -> dict:
  """{split: (path of language a, path of language b)} of every split with both languages."""
  languages = sorted((c.source_lang, c.target_lang))
  return {split: tuple(os.path.join(root, relative_path(c.name, file, lang))
                       for lang in languages)
          for split, (file, langs) in SPLITS.items() if set(languages) <= set(langs)}


class Multi30kConfig(tfds.core.BuilderConfig):
  """The files of one variant and language pair: {split: (file of lang_a, file of lang_b)}."""

  def __init__(self, *, files, languages):
    identity = repr((sorted(files.items()), languages,
                     [(os.path.getsize(p), os.path.getmtime(p))
                      for pair in files.values() for p in pair]))
    super().__init__(name=hashlib.sha1(identity.encode()).hexdigest()[:16],
                     version=tfds.core.Version("1.0.0"))
    self.files = files
    self.languages = languages


class TransformerJaxMulti30k(tfds.core.GeneratorBasedBuilder):
  """Multi30k task 1 of one language pair, in the repository's line order."""

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description="Multi30k task 1 (" + URL + "): " + repr(self.builder_config.files),
        features=tfds.features.Translation(languages=self.builder_config.languages),
        homepage=URL,
        disable_shuffling=True)  # keep the file order

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(paths)
            for split, paths in self.builder_config.files.items()}

  def _generate_examples(self, paths):
    lang_a, lang_b = self.builder_config.languages
    with _open(paths[0]) as fa, _open(paths[1]) as fb:
      for i, (a, b) in enumerate(zip(fa, fb, strict=True)):
        texts = []
        for path, line in ((paths[0], a), (paths[1], b)):
          try:
            texts.append(line.removeprefix(codecs.BOM_UTF8).decode("utf-8").rstrip("\r\n"))
          except UnicodeDecodeError:
            raise DataError(f"{path}, line {i + 1}: not UTF-8 text.") from None
        yield i, {lang_a: texts[0], lang_b: texts[1]}


def _open(path):
  """The file's lines as bytes (decompressed when it ends in .gz)."""
  return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _line_count(path) -> int:
  try:
    with _open(path) as f:
      return sum(1 for _ in f)
  except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
    raise DataError(f"cannot read {path}: {error}") from None


def builder(c: DataConfig):
  """The (maybe not yet prepared) builder of `c`'s language pair; DataUnavailableError when
  `data.manual_dir` is not set or lacks a file of the pair."""
  if not c.manual_dir:
    raise DataUnavailableError(
        f"data.name={c.name!r} reads a copy of {URL} and data.manual_dir is not set: git clone "
        f"{URL} and run with --config.data.manual_dir=<the clone> (the directory holding "
        f"{relative_path(c.name, 'train', c.source_lang)}); nothing is downloaded.")
  root = os.path.abspath(c.manual_dir)
  files = _expected_files(c, root)
  missing = [os.path.relpath(p, root) for pair in files.values() for p in pair
             if not os.path.isfile(p)]
  if missing:
    raise DataUnavailableError(
        f"{c.name}: {root} (data.manual_dir) lacks {len(missing)} of the {2 * len(files)} "
        f"files of {c.source_lang}-{c.target_lang}: {', '.join(missing)}. Put a copy of {URL} "
        f"there (git clone {URL}) or set --config.data.manual_dir to one (the directory "
        "holding data/task1); nothing is downloaded.")
  config = Multi30kConfig(files=files, languages=tuple(sorted((c.source_lang, c.target_lang))))
  return TransformerJaxMulti30k(config=config, data_dir=c.data_dir or None,
                                file_format="array_record")


def check_files(b) -> None:
  """DataError if a file of builder `b` is unreadable or empty, or the two languages of a
  split have different line counts."""
  for path_a, path_b in b.builder_config.files.values():
    counts = [_line_count(path_a), _line_count(path_b)]
    for path, count in zip((path_a, path_b), counts):
      if not count:
        raise DataError(f"{path} is empty: a Multi30k file holds one sentence per line.")
    if counts[0] != counts[1]:
      raise DataError(f"{path_a} has {counts[0]} lines but {path_b} has {counts[1]}: line i "
                      "of one must translate line i of the other (a partial copy?).")
