"""SentencePiece (BPE, or a unigram model with `data.vocab.model`), one vocabulary shared by source
and target.

Ids (`transformer_jax.conventions`): PAD_ID = 0 (also the decoder's start
token), EOS_ID = 1, UNK_ID = 2, no BOS. `encode` (sources) and
`encode_target`, and their `_batch` forms for lists of sentences, add no
EOS; the pipeline appends it. A `data.vocab.path`
that is a directory of Marian tokenizer files (`marian.FILES`) loads a
`marian.MarianTokenizer` instead, with the same interface and ids.
"""

import hashlib
import io
import logging
import os
import re

import numpy as np
import sentencepiece as spm
from etils import epath

from transformer_jax import fileio
from transformer_jax.conventions import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data import marian, sources
from transformer_jax.data.config import DataConfig
from transformer_jax.data.errors import DataError
from transformer_jax.errors import FieldError

log = logging.getLogger(__name__)


class Tokenizer:
  """A SentencePiece model: `encode(str) -> list[int]`, `decode(ids) -> str`.

  Picklable (it carries the serialized model), so Grain workers can use it.
  """

  def __init__(self, model_proto, path=None):
    self.model_proto = model_proto
    self.path = path  # where the model file lives, if anywhere
    self.digest = hashlib.sha1(model_proto).hexdigest()
    try:
      self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError:  # SentencePiece's error for bytes that are not a model.
      raise DataError(f"{path or 'the vocabulary'} is not a SentencePiece model") from None
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id(), self._sp.bos_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID, -1):
      raise DataError(
        f"SentencePiece model {path or ''} has (pad, eos, unk, bos) "
        f"ids {ids}; this project needs {(PAD_ID, EOS_ID, UNK_ID, -1)}."
      )

  @property
  def vocab_size(self):
    return self._sp.get_piece_size()

  def encode(self, text):
    """Token ids of `text`, without EOS."""
    return self._sp.encode(text)

  def encode_target(self, text):
    """Token ids of a target sentence: the same vocabulary as sources."""
    return self.encode(text)

  def encode_batch(self, texts):
    """`encode` of each of `texts`, on all CPU cores."""
    return self._sp.encode(list(texts), num_threads=os.cpu_count() or 1)

  encode_target_batch = encode_batch

  def decode(self, ids):
    """Text of `ids` (list or 1-D array), stopping at the first EOS, ignoring PAD."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    return self._sp.decode([i for i in ids if i != PAD_ID])

  def __getstate__(self):
    return {"model_proto": self.model_proto, "path": self.path}

  def __setstate__(self, state):
    self.__init__(state["model_proto"], state["path"])


# SentencePiece's refusals of a vocabulary size that the text does not fit, and the size it needs.
_TOO_LARGE = re.compile(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)")


def train_model(sentences, vocab_size, model_type="bpe"):
  """Serialized SentencePiece model (`model_type` bpe or unigram) trained on an iterable of strings.

  FieldError naming `data.vocab.size` and the largest (or smallest) size that
  works when the text does not fit `vocab_size` tokens.
  """
  buffer = io.BytesIO()
  try:
    with open(os.devnull, "w") as quiet:
      spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buffer,
        logstream=quiet,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        num_threads=os.cpu_count() or 1,
      )
  except RuntimeError as error:
    if match := _TOO_LARGE.search(str(error)):
      raise FieldError(
        "data.vocab",
        "size",
        f"={vocab_size} is more than the training text supports: set it to at most {match[1]}",
      ) from None
    if match := _TOO_SMALL.search(str(error)):
      raise FieldError(
        "data.vocab",
        "size",
        f"={vocab_size} is too small for the characters "
        f"of the training text: set it to at least {match[1]}",
      ) from None
    raise
  return buffer.getvalue()


def default_vocab_path(c: DataConfig, vocab_dir):
  """<vocab_dir>/<dataset>-<languages>-<vocab size>.model (same for both directions; unigram
  vocabularies end in -unigram.model)."""
  name = re.sub(r"[^A-Za-z0-9_.]+", "_", c.source.name)
  vocab_key = sources.SOURCES[c.source.name].vocab_key
  if vocab_key is not None:  # 'text': the prefix of its training files.
    name += vocab_key(c.source)
  langs = "-".join(sorted((c.source.source_lang, c.source.target_lang)))
  kind = "" if c.vocab.model == "bpe" else f"-{c.vocab.model}"
  return os.path.join(vocab_dir, f"{name}-{langs}-{c.vocab.size}{kind}.model")


def _training_sentences(source, n):
  """Both sides of `n` (at most `len(source)`) evenly spaced pairs of ParallelSource `source`."""
  ids = np.linspace(0, len(source) - 1, n).round().astype(np.int64)
  for start in range(0, n, 4096):
    for src, tgt in source.pairs(ids[start : start + 4096]):
      yield src
      yield tgt


def _save(proto: bytes, path: str) -> None:
  """Write the serialized model to `path` atomically (other hosts never read a partial file)."""
  try:
    fileio.write_atomically(fileio.absolute(path), proto)
  except OSError as error:
    raise DataError(f"cannot write the vocabulary {path}: {error.strerror or error}") from None


def get_tokenizer(c: DataConfig, vocab_dir):
  """Loads the vocabulary at `data.vocab.path` (default: `default_vocab_path` in `vocab_dir`),
  training and saving it first if absent; a directory of Marian files gives a MarianTokenizer."""
  path = c.vocab.path or default_vocab_path(c, vocab_dir)
  if not epath.Path(path).exists():
    source = sources.open_split(c, c.source.train_split)
    sample = min(len(source), c.vocab.sample_size)
    log.info(
      "Training a %d-token SentencePiece %s vocabulary on %d of the %d %s pairs "
      "of %s (%d sentences)",
      c.vocab.size,
      c.vocab.model,
      sample,
      len(source),
      c.source.train_split,
      c.source.name,
      2 * sample,
    )
    proto = train_model(_training_sentences(source, sample), c.vocab.size, c.vocab.model)
    _save(proto, path)
    log.info("Saved the vocabulary to %s", path)
  return load_tokenizer(c, vocab_dir)


def load_tokenizer(c: DataConfig, vocab_dir):
  """The vocabulary `get_tokenizer` would load, never trained: DataError when it is not there."""
  path = c.vocab.path or default_vocab_path(c, vocab_dir)
  if marian.is_marian_directory(path):
    return _checked_size(marian.MarianTokenizer.load(path), c)
  try:
    proto = epath.Path(path).read_bytes()
  except FileNotFoundError:
    raise DataError(f"no vocabulary at {path}") from None
  except OSError as error:
    raise DataError(f"cannot read the vocabulary {path}: {error.strerror or error}") from None
  return _checked_size(Tokenizer(proto, path), c)


def _checked_size(tokenizer, c):
  if tokenizer.vocab_size != c.vocab.size:
    log.warning(
      "%s has %d tokens, data.vocab.size says %d: using the file.",
      tokenizer.path,
      tokenizer.vocab_size,
      c.vocab.size,
    )
  return tokenizer
