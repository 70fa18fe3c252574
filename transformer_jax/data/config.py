"""The data settings (`DataConfig`, an experiment's `config.data`), defaults: the embedded data.

Three sections, each a part of the data path: `source` (which pairs: `SourceSettings`), `vocab`
(their vocabulary: `VocabSettings`) and `batch` (their batches: `BatchSettings`), so that a
setting's path says what it is for: `data.source.name`, `data.vocab.size`, `data.batch.tokens`.
`DataConfig.MOVED` says where the settings of the flat `config.data` of before went.
"""

import dataclasses
from typing import ClassVar

from transformer_jax import schema
from transformer_jax.data.sources import SOURCES
from transformer_jax.errors import FieldError

BATCH_MODES = ("tokens", "packed", "padded")
OVERLONG = ("drop", "truncate")
VOCAB_MODELS = ("bpe", "unigram")
BPE_DROPOUT_SIDES = {"both": (0, 1), "source": (0,), "target": (1,)}


@dataclasses.dataclass(frozen=True)
class SourceSettings:
  """Which pairs (`config.data.source`): a source of the table `sources.SOURCES`, its language
  pair and direction, where its files are, and its splits."""

  name: str = schema.setting(
    "embedded", "the source of the pairs (a name in data/sources.py's table)", choices=SOURCES
  )
  source_lang: str = schema.setting("en", "translate from this language of the pair")
  target_lang: str = schema.setting("sy", "into this one (swap the two to reverse the direction)")
  data_dir: str = schema.setting("", "TFDS data dir ('' = $TFDS_DATA_DIR or ~/tensorflow_datasets)")
  manual_dir: str = schema.setting(
    "",
    "WMT files downloaded by hand ('' = "
    "<data_dir>/downloads/manual); 'multi30k', 'multi30k_tok': the "
    "root of a clone of github.com/multi30k/dataset",
  )
  text_train: str = schema.setting("", "'text': path prefix of the training files <prefix>.<lang>")
  text_validation: str = schema.setting("", "'text': path prefix of the validation files")
  text_test: str = schema.setting("", "'text': path prefix of the test files ('' = no test split)")
  train_split: str = schema.setting("train", "split to train on")
  eval_split: str = schema.setting("validation", "split evaluated during training")

  def __post_init__(self):
    schema.check(self, "data.source")
    source = SOURCES[self.name]
    for field in ("source_lang", "target_lang"):
      value = getattr(self, field)
      if source.languages is not None and value not in source.languages:
        _fail("source", field, value, f"a language of {self.name}: {' | '.join(source.languages)}")
      if source.languages is None and not value.isidentifier():
        _fail("source", field, value, "a language code such as 'en' (the file suffix)")
    if self.source_lang == self.target_lang:
      _fail(
        "source", "target_lang", self.target_lang, "a language other than data.source.source_lang"
      )
    for field, what in source.needs.items():
      if not getattr(self, field):
        _fail("source", field, getattr(self, field), f"{what} when data.source.name={self.name!r}")


@dataclasses.dataclass(frozen=True)
class VocabSettings:
  """The vocabulary of the pairs (`config.data.vocab`): trained here, or a file, and how the
  training text is segmented."""

  size: int = schema.setting(
    1000,
    "shared SentencePiece vocabulary (paper: 37000 EN-DE, 32000 EN-FR); a size the "
    "training text cannot fill (or its characters do not fit) stops the run, naming the "
    "largest (smallest) size that works",
    ge=16,
  )
  model: str = schema.setting(
    "bpe",
    "the vocabulary a run trains: bpe (byte-pair merges, as the paper's) or unigram (a unigram "
    "language model's pieces); an existing vocabulary loads whatever its model",
    choices=VOCAB_MODELS,
  )
  path: str = schema.setting(
    "",
    "SentencePiece model, or a directory of Marian files source.spm, target.spm, "
    "vocab.json ('' = <workdir>/vocab/<dataset>-<langs>-<size>.model, "
    "<dataset>-<langs>-<size>-unigram.model for unigram)",
  )
  bpe_dropout: float = schema.setting(
    0.0,
    "BPE-dropout of the training text: every epoch segments each pair anew, each merge of the "
    "BPE vocabulary skipped with this probability (0.1 in its paper); evaluation and decoding "
    "keep the deterministic segmentation",
    ge=0,
    lt=1,
    means={0: "off: one deterministic segmentation, as the paper's"},
  )
  bpe_dropout_sides: str = schema.setting(
    "both",
    "the sides of a training pair that data.vocab.bpe_dropout segments anew: both (as its "
    "paper), source or target; the other keeps its deterministic segmentation",
    choices=BPE_DROPOUT_SIDES,
  )
  sample_size: int = schema.setting(
    200_000, "at most this many training pairs (evenly spaced) train the vocabulary", ge=1
  )

  def __post_init__(self):
    schema.check(self, "data.vocab")


@dataclasses.dataclass(frozen=True)
class BatchSettings:
  """The batches of the pairs (`config.data.batch`): their kind, sizes (global: all processes
  together) and lengths, and how they are read."""

  mode: str = schema.setting(
    "tokens",
    "'tokens': length-bucketed batches (paper); 'packed': packed rows; 'padded': one "
    "pair per row, every row max(max_source_length, max_target_length) long (one shape)",
    choices=BATCH_MODES,
  )
  bucket_growth: float = schema.setting(
    1.25,
    "'tokens': each bucket length is about this times the one before (8, 16, 24, 32, "
    "40, 56, ... at 1.25; 8, 16, 32, 64, ... at 2); fewer buckets compile fewer train steps "
    "but pad more",
    gt=1,
    le=4,
  )
  tokens: int = schema.setting(
    4096,
    "'tokens', 'padded': max source and max target tokens (padding included) per global batch",
    ge=1,
  )
  size: int = schema.setting(32, "'packed': rows per global batch", ge=1)
  max_length: int = schema.setting(128, "'packed': tokens per row", ge=1)
  max_source_length: int = schema.setting(
    72, "training pairs with more source tokens (EOS included) are over-long", ge=1
  )
  max_target_length: int = schema.setting(
    72, "training pairs with more target tokens (EOS included) are over-long", ge=1
  )
  overlong: str = schema.setting(
    "drop",
    "over-long training pairs are dropped or truncated (evaluation keeps all)",
    choices=OVERLONG,
  )
  multiple: int = schema.setting(
    8, "global batch rows are a multiple of this (the data-parallel device count)", ge=1
  )
  window: int = schema.setting(
    16384, "training pairs grouped by length / packed together (more: less padding)", ge=1
  )
  num_workers: int = schema.setting(
    0, "Grain worker processes", ge=0, means={0: "one background thread in this process"}
  )
  eval_size: int = schema.setting(64, "rows per global evaluation batch", ge=1)

  def __post_init__(self):
    schema.check(self, "data.batch")
    if self.mode == "packed":
      for field in ("max_source_length", "max_target_length"):
        if getattr(self, field) > self.max_length:
          _fail(
            "batch",
            field,
            getattr(self, field),
            f"at most data.batch.max_length={self.max_length} in 'packed' mode",
          )
    for field in ("size",) * (self.mode == "packed") + ("eval_size",):
      if getattr(self, field) % self.multiple:
        _fail(
          "batch", field, getattr(self, field), f"a multiple of data.batch.multiple={self.multiple}"
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Which data, its vocabulary and its batches; validated on construction (FieldError naming
  `data.<section>.<field>`)."""

  source: SourceSettings = schema.section(SourceSettings)
  vocab: VocabSettings = schema.section(VocabSettings)
  batch: BatchSettings = schema.section(BatchSettings)

  # Where each setting of the flat `config.data` of before is now (`schema.build` says so).
  MOVED: ClassVar[dict[str, str]] = {
    **{
      name: f"source.{name}"
      for name in (
        "name",
        "source_lang",
        "target_lang",
        "data_dir",
        "manual_dir",
        "text_train",
        "text_validation",
        "text_test",
        "train_split",
        "eval_split",
      )
    },
    "vocab_size": "vocab.size",
    "vocab_model": "vocab.model",
    "vocab_path": "vocab.path",
    "bpe_dropout": "vocab.bpe_dropout",
    "bpe_dropout_sides": "vocab.bpe_dropout_sides",
    "tokenizer_sample_size": "vocab.sample_size",
    "batch_mode": "batch.mode",
    "bucket_growth": "batch.bucket_growth",
    "tokens_per_batch": "batch.tokens",
    "batch_size": "batch.size",
    "max_length": "batch.max_length",
    "max_source_length": "batch.max_source_length",
    "max_target_length": "batch.max_target_length",
    "overlong": "batch.overlong",
    "batch_multiple": "batch.multiple",
    "window": "batch.window",
    "num_workers": "batch.num_workers",
    "eval_batch_size": "batch.eval_size",
  }


def _fail(section, field, value, allowed):
  raise FieldError(f"data.{section}", field, f"={value!r} is invalid: allowed {allowed}.")
