"""The data path: sources (TFDS, no TensorFlow), SentencePiece vocabulary, Grain pipeline.

Public API (the training and decoding code call exactly these):
  DataConfig(...)                   the data settings (`config.data`), checked on construction
  get_tokenizer(c, vocab_dir)       -> Tokenizer (trained once, then loaded)
  make_train_loader(c, tokenizer, *, seed, shard_index, shard_count)
  make_eval_batches(c, tokenizer, split, *, shard_index=0, shard_count=1)
  train_batch_shapes(c, shard_count=1)  -> [(global rows, length)] training can produce
  open_split(c, split)              -> ParallelSource: (source, target) pairs of a split
  split_texts(c, split)             -> (source texts, target texts) of a split
Errors the user fixes: DataError (a file or split), DataUnavailableError (not prepared).
"""

from transformer_jax.data.config import DataConfig
from transformer_jax.data.pipeline import make_eval_batches
from transformer_jax.data.pipeline import make_train_loader
from transformer_jax.data.pipeline import train_batch_shapes
from transformer_jax.data.sources import DataError
from transformer_jax.data.sources import DataUnavailableError
from transformer_jax.data.sources import open_split
from transformer_jax.data.sources import split_texts
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.tokenizer import get_tokenizer

__all__ = [
    "DataConfig", "DataError", "DataUnavailableError", "Tokenizer", "get_tokenizer",
    "make_eval_batches", "make_train_loader", "open_split", "split_texts", "train_batch_shapes",
]
