"""What a source of parallel text is: `Source`, its entry in the table of sources
(`sources.SOURCES`), and `ParallelSource`, a split of it opened for reading."""

import dataclasses
from collections.abc import Callable, Mapping

from transformer_jax.data import tfds_prepare

SPLITS = ("train", "validation", "test")


def prepare(builder, c) -> bool:
  """`Source.prepare` of most sources: TFDS's own preparation (`tfds_prepare.prepare`)."""
  del c
  return tfds_prepare.prepare(builder)


@dataclasses.dataclass(frozen=True)
class Source:
  """One source of parallel text: its name (`data.source.name`) and how its pairs are read.

  Its functions take the source settings `c` (`data.source`, a `SourceSettings`). `builder(c)`
  makes the TFDS builder of the pairs `c` asks for (not yet prepared, maybe: no data is read),
  `prepare(builder, c)` prepares it once, returning False when it must be made again (another
  process prepared it meanwhile, or it was uploaded to a data dir in a bucket: see
  `tfds_prepare.prepare`). A split is opened by the name its dataset stores (`aliases`: other
  names of a split) after `check_split(c, split, stored)`, which raises when `c` cannot read it.
  `needs` and `languages` are checked when the settings are made (`SourceSettings`).
  """

  name: str
  languages: tuple[str, ...] | None  # the languages it has; None: any two (file suffixes)
  builder: Callable
  prepare: Callable = prepare
  splits: tuple[str, ...] | None = SPLITS  # the splits it has; None: those `builder` holds
  aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)  # another name -> split
  check_split: Callable | None = None
  # A setting the source needs set -> what it is ('text': the prefix of the training files).
  needs: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # What tells the vocabularies of its datasets apart beyond its name and languages, if anything
  # ('text': its training files): a function of `c`, the text added to the vocabulary's name.
  vocab_key: Callable | None = None


@dataclasses.dataclass(frozen=True)
class ParallelSource:
  """Random access to the (source, target) sentence pairs of one split.

  Picklable, so Grain worker processes can read from it.
  """

  records: object  # a TFDS ArrayRecord data source of {language: bytes} dicts
  source_lang: str
  target_lang: str
  fingerprint: str  # identifies the split's contents and the direction

  def __len__(self):
    return len(self.records)

  def pairs(self, ids):
    """[(source text, target text)] for the example indices `ids`."""
    records = self.records.__getitems__([int(i) for i in ids])
    return [
      (r[self.source_lang].decode("utf-8"), r[self.target_lang].decode("utf-8")) for r in records
    ]

  def all_pairs(self, chunk: int = 4096):
    """Every (source text, target text) of the split, in order, read `chunk` at a time."""
    return [
      pair
      for start in range(0, len(self), chunk)
      for pair in self.pairs(range(start, min(start + chunk, len(self))))
    ]
