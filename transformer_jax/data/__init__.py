"""The data path: sources (TFDS, no TensorFlow), SentencePiece vocabulary, Grain pipeline.

Public API (the training and decoding code call exactly these):
  default_config()                       the `config.data` ConfigDict
  validate_config(data_config)           raises FieldError naming `data.<field>`
  get_tokenizer(data_config, vocab_dir)  -> Tokenizer (trained once, then loaded)
  make_train_loader(data_config, tokenizer, *, seed, shard_index, shard_count)
  make_eval_batches(data_config, tokenizer, split, *, shard_index=0, shard_count=1)
  train_batch_shapes(data_config, shard_count=1)  -> [(global rows, length)] training can produce
  open_split(data_config, split)         -> ParallelSource: (source, target) pairs of a split
  split_texts(data_config, split)        -> (source texts, target texts) of a split
Errors the user fixes: DataError (a file or split), DataUnavailableError (not prepared).
"""

from transformer_jax.data.config import default_config
from transformer_jax.data.config import validate_config
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
    "DataError", "DataUnavailableError", "Tokenizer", "default_config", "get_tokenizer",
    "make_eval_batches", "make_train_loader", "open_split", "split_texts", "train_batch_shapes",
    "validate_config",
]
