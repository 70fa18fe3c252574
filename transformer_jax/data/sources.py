"""The sources of parallel text, one table (`SOURCES`: `data.source.name` -> `Source`), and the
reading of a split of one: `open_split` returns a `ParallelSource`, random access to its (source,
target) strings. Every source is prepared once as ArrayRecord and read through TFDS (no TensorFlow):
  * 'embedded', 'embedded_tiny': the synthetic corpus of `embedded.py` (`embedded_source.py`);
  * 'wmt14_translate/de-en', 'wmt14_translate/fr-en', 'wmt17_translate/de-en': TFDS's WMT
    builders, downloaded or from TFDS's manual dir (`wmt.py`);
  * 'multi30k', 'multi30k_tok': a copy of the Multi30k repository in data.source.manual_dir
    (`multi30k.py`);
  * 'text': the user's files `<prefix>.<lang>` (`text.py`, `parallel_text.py`).
Preparing and data dirs in a bucket: `tfds_prepare.py`.

A source is one entry here: a module defines its `Source` (`source.py` says what one holds) and
the table below names it.
"""

from typing import TYPE_CHECKING

from transformer_jax.data import embedded_source, multi30k, text, tfds_prepare, wmt
from transformer_jax.data.errors import DataError
from transformer_jax.data.source import ParallelSource

if TYPE_CHECKING:  # Hints only: data/config.py imports this table to check a source's settings.
  from transformer_jax.data.config import DataConfig, SourceSettings

SOURCES = {
  source.name: source
  for source in (*embedded_source.SOURCES, *wmt.SOURCES, *multi30k.SOURCES, text.SOURCE)
}


def get_builder(c: "DataConfig"):
  """The TFDS builder of `data.source`, with its data prepared (first use only)."""
  source = SOURCES[c.source.name]
  while True:
    builder = source.builder(c.source)
    if source.prepare(builder, c.source):
      return builder
    # Made again to read what was just prepared (by another process, or uploaded to a bucket):
    # that builder finds its dataset prepared, so this happens once.


def _stored_split(source, c: "SourceSettings", split: str) -> str:
  """The split of `source`'s dataset that `split` names (an alias, or itself); DataError for a
  split it does not have, and the source's own `check_split`."""
  stored = source.aliases.get(split, split)
  if source.splits is not None and stored not in source.splits:
    raise DataError(
      f"{c.name} has no split {split!r}: it has {' | '.join([*source.splits, *source.aliases])}."
    )
  if source.check_split is not None:
    source.check_split(c, split, stored)
  return stored


def open_split(c: "DataConfig", split) -> ParallelSource:
  """The `split` of `data.source` as a ParallelSource in the configured direction."""
  s = c.source
  split = _stored_split(SOURCES[s.name], s, split)
  builder = get_builder(c)
  if split not in builder.info.splits:
    raise DataError(
      f"{builder.info.full_name} has no split {split!r}: it has {' | '.join(builder.info.splits)}."
    )
  records = tfds_prepare.readable(builder).as_data_source(split=split)
  fingerprint = (
    f"{builder.info.full_name}:{builder.data_dir}:{split}:"
    f"{len(records)}:{s.source_lang}->{s.target_lang}"
  )
  return ParallelSource(records, s.source_lang, s.target_lang, fingerprint)


def split_texts(c: "DataConfig", split) -> tuple[list[str], list[str]]:
  """`(sources, targets)`: the texts of every pair of `split`, in order."""
  pairs = open_split(c, split).all_pairs()
  return [source for source, _ in pairs], [target for _, target in pairs]
