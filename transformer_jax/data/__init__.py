"""The data path: sources (TFDS, no TensorFlow), SentencePiece vocabulary, Grain pipeline.

Public API (the rest of the package uses exactly these; tests/test_imports.py
keeps it so):
  DataConfig(source=, vocab=, batch=)  the data settings (`config.data`), checked on
                                    construction: its sections SourceSettings (which pairs),
                                    VocabSettings (their vocabulary), BatchSettings (batches)
  BATCH_MODES                       the values of BatchSettings.mode
  get_tokenizer(c, vocab_dir)       -> Tokenizer (trained once, then loaded)
  load_tokenizer(c, vocab_dir)      -> Tokenizer (loaded; DataError when there is none)
  make_train_loader(c, tokenizer, *, seed, shard_index, shard_count)
  make_eval_batches(c, tokenizer, split, *, shard_index=0, shard_count=1, max_length=None)
  train_batch_shapes(c, shard_count=1)  -> [(global rows, length)] training can produce
  rows_multiple(c, shard_index, shard_count)  -> what every batch's rows are a multiple of
  padded_length(n)                  -> the padded length of n tokens (few shapes compile)
  open_split(c, split)              -> ParallelSource: (source, target) pairs of a split
  split_texts(c, split)             -> (source texts, target texts) of a split
  marian                            the vocabulary of Marian models (MarianTokenizer, FILES,
                                    project_order)
Errors the user fixes: DataError (a file or split), DataUnavailableError (not prepared).
"""

from transformer_jax.data import marian
from transformer_jax.data.config import (
  BATCH_MODES,
  BatchSettings,
  DataConfig,
  SourceSettings,
  VocabSettings,
)
from transformer_jax.data.errors import DataError, DataUnavailableError
from transformer_jax.data.pipeline import (
  make_eval_batches,
  make_train_loader,
  padded_length,
  rows_multiple,
  train_batch_shapes,
)
from transformer_jax.data.sources import open_split, split_texts
from transformer_jax.data.tokenizer import Tokenizer, get_tokenizer, load_tokenizer

__all__ = [
  "BATCH_MODES",
  "BatchSettings",
  "DataConfig",
  "DataError",
  "DataUnavailableError",
  "SourceSettings",
  "Tokenizer",
  "get_tokenizer",
  "load_tokenizer",
  "make_eval_batches",
  "make_train_loader",
  "marian",
  "open_split",
  "padded_length",
  "rows_multiple",
  "split_texts",
  "train_batch_shapes",
  "VocabSettings",
]
