"""The data path: sources (TFDS, no TensorFlow), SentencePiece vocabulary, Grain pipeline.

Public API (the training and decoding code call exactly these):
  default_config()                     the `config.data` ConfigDict
  validate_config(data_config)         raises ValueError naming `data.<field>`
  get_tokenizer(data_config, workdir)  -> Tokenizer (trained once, then loaded)
  make_train_loader(data_config, tokenizer, *, seed, shard_index, shard_count)
  make_eval_batches(data_config, tokenizer, split, *, shard_index=0, shard_count=1)
"""

from transformer_jax.data.config import default_config
from transformer_jax.data.config import validate_config
from transformer_jax.data.pipeline import make_eval_batches
from transformer_jax.data.pipeline import make_train_loader
from transformer_jax.data.sources import DataUnavailableError
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.data.tokenizer import PAD_ID
from transformer_jax.data.tokenizer import UNK_ID
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.data.tokenizer import get_tokenizer

__all__ = [
    "DataUnavailableError", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer",
    "default_config", "get_tokenizer", "make_eval_batches", "make_train_loader",
    "validate_config",
]
