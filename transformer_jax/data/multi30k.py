"""Multi30k (WMT16 multimodal task 1): image captions in en, de, fr, cs, read from a copy of
https://github.com/multi30k/dataset (`data.source.manual_dir`, the directory holding `data/task1`).

Two variants, chosen by `data.source.name`: 'multi30k' reads the cased text
`data/task1/raw/<file>.<lang>.gz`, 'multi30k_tok' the lowercased, normalized and
tokenized text `data/task1/tok/<file>.lc.norm.tok.<lang>`. The files of the two
languages of `data.source.source_lang` / `data.source.target_lang` are converted once into
ArrayRecord in `data.source.data_dir` (again when a file changes) as parallel text
(`parallel_text.py`), as the 'text' source is. Nothing is downloaded. The copy may be in a
bucket (`data.source.manual_dir` a URL such as gs://).
"""

from etils import epath

from transformer_jax import fileio
from transformer_jax.data import parallel_text
from transformer_jax.data.errors import DataError, DataUnavailableError
from transformer_jax.data.source import Source

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


def check_split(c, split: str, stored: str) -> None:
  """`Source.check_split`: DataError unless the repository's file of split `stored` (asked for as
  `split`) has both languages of `c`."""
  file, langs = SPLITS[stored]
  for lang in (c.source_lang, c.target_lang):
    if lang not in langs:
      have = [s for s, (_, ls) in SPLITS.items() if c.source_lang in ls and c.target_lang in ls]
      have += [alias for alias, target in ALIASES.items() if target in have]
      raise DataError(
        f"{c.name} has no {lang} text for split {split!r} (the repository's "
        f"{file} is {', '.join(langs)} only): {c.source_lang}-{c.target_lang} "
        f"has {' | '.join(have)} (data.source.train_split, data.source.eval_split, "
        "decode.split)."
      )


def _expected_files(c) -> dict:
  """{split: (path of language a, path of language b)} inside the repository of every split
  with both languages."""
  languages = sorted((c.source_lang, c.target_lang))
  return {
    split: tuple(relative_path(c.name, file, lang) for lang in languages)
    for split, (file, langs) in SPLITS.items()
    if set(languages) <= set(langs)
  }


def builder(c):
  """The (maybe not yet prepared) builder of `c`'s language pair; DataUnavailableError when
  `data.source.manual_dir` is not set or lacks a file of the pair."""
  if not c.manual_dir:
    raise DataUnavailableError(
      f"data.source.name={c.name!r} reads a copy of {URL} and data.source.manual_dir is not "
      f"set: git clone {URL} and run with --config.data.source.manual_dir=<the clone> (the "
      f"directory holding {relative_path(c.name, 'train', c.source_lang)}); nothing is downloaded."
    )
  root = fileio.absolute(c.manual_dir)
  relative = _expected_files(c)
  missing = [
    name for names in relative.values() for name in names if not (epath.Path(root) / name).is_file()
  ]
  if missing:
    raise DataUnavailableError(
      f"{c.name}: {root} (data.source.manual_dir) lacks {len(missing)} of the {2 * len(relative)} "
      f"files of {c.source_lang}-{c.target_lang}: {', '.join(missing)}. Put a copy of {URL} "
      f"there (git clone {URL}) or set --config.data.source.manual_dir to one (the directory "
      "holding data/task1); nothing is downloaded."
    )
  files = {
    split: tuple(str(epath.Path(root) / name) for name in names)
    for split, names in relative.items()
  }
  return parallel_text.builder(files, tuple(sorted((c.source_lang, c.target_lang))), c.data_dir)


SOURCES = tuple(
  Source(
    name,
    LANGUAGES,
    builder,
    parallel_text.prepare,
    splits=tuple(SPLITS),
    aliases=ALIASES,
    check_split=check_split,
  )
  for name in NAMES
)
