"""The tokenizer of Marian (OPUS-MT) models: two SentencePiece models, one table of ids.

A Marian directory holds `source.spm` (pieces of source sentences),
`target.spm` (pieces of target sentences) and `vocab.json` (piece -> id, one
table for both sides). Marian's ids put `</s>` and `<unk>` first and `<pad>`
(also its decoder's start token) last; the project's are PAD_ID, EOS_ID,
UNK_ID (`conventions`). `project_order` maps one onto the other: the project
id of a token is its place in that list, so a converted model keeps every
convention of this project, the decoder's start token included (both are pad).
"""

import hashlib
import json

import numpy as np
import sentencepiece as spm
from etils import epath

from transformer_jax.conventions import EOS_ID, PAD_ID, UNK_ID
from transformer_jax.data.errors import DataError

FILES = ("source.spm", "target.spm", "vocab.json")
WORD_START = "\u2581"  # SentencePiece's mark of a piece that starts a word.
# Marian's names of the tokens that have fixed project ids.
SPECIAL_TOKENS = {PAD_ID: "<pad>", EOS_ID: "</s>", UNK_ID: "<unk>"}


def is_marian_directory(path: str) -> bool:
  """Whether `path` (a local path or a URL such as gs://) is a directory holding the files of a
  Marian tokenizer."""
  return all(epath.Path(path, name).is_file() for name in FILES)


def project_order(vocab: dict[str, int]) -> list[int]:
  """The Marian id of each project id: the special tokens at their project ids, then every other
  Marian id in increasing order. DataError unless `vocab` numbers its tokens 0..n-1 and has the
  special tokens."""
  if sorted(vocab.values()) != list(range(len(vocab))):
    raise DataError("vocab.json does not number its tokens 0, 1, ... without gaps")
  missing = [name for name in SPECIAL_TOKENS.values() if name not in vocab]
  if missing:
    raise DataError(f"vocab.json lacks the special tokens {', '.join(missing)}")
  fixed = {project: vocab[name] for project, name in SPECIAL_TOKENS.items()}
  others = iter(sorted(set(range(len(vocab))) - set(fixed.values())))
  return [fixed[i] if i in fixed else next(others) for i in range(len(vocab))]


def _processor(proto: bytes, name: str):
  try:
    return spm.SentencePieceProcessor(model_proto=proto)
  except RuntimeError:  # SentencePiece's error for bytes that are not a model.
    raise DataError(f"{name} is not a SentencePiece model") from None


class MarianTokenizer:
  """Source pieces from `source.spm`, target pieces from `target.spm`, project ids through
  `vocab.json`; the interface of `tokenizer.Tokenizer`. Picklable (it carries the files)."""

  def __init__(self, files: dict[str, bytes], path: str):
    self.files, self.path = files, path
    self.digest = hashlib.sha1(b"".join(files[name] for name in FILES)).hexdigest()
    try:
      vocab = json.loads(files["vocab.json"])
    except ValueError as error:
      raise DataError(f"{path}/vocab.json is not JSON: {error}") from None
    order = project_order(vocab)
    marian_to_project = np.empty(len(order), np.int64)
    marian_to_project[order] = np.arange(len(order))
    self._ids = {piece: int(marian_to_project[i]) for piece, i in vocab.items()}
    self._pieces = [None] * len(order)
    for piece, i in self._ids.items():
      self._pieces[i] = piece
    self._source = _processor(files["source.spm"], f"{path}/source.spm")
    self._target = _processor(files["target.spm"], f"{path}/target.spm")

  @classmethod
  def load(cls, directory: str) -> "MarianTokenizer":
    """The tokenizer of the Marian files in `directory` (a local path or a URL)."""
    files = {}
    for name in FILES:
      try:
        files[name] = epath.Path(directory, name).read_bytes()
      except OSError as error:
        raise DataError(f"cannot read {directory}/{name}: {error.strerror or error}") from None
    return cls(files, directory)

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  def _encode(self, processor, text: str) -> list[int]:
    """Project ids of `text`'s pieces (a leading language code `>>xx<<` is one token)."""
    code = []
    if text.startswith(">>") and "<<" in text:
      end = text.index("<<") + 2
      code, text = [text[:end]], text[end:]
    pieces = code + processor.encode(text, out_type=str)
    return [self._ids.get(piece, UNK_ID) for piece in pieces]

  def encode(self, text: str) -> list[int]:
    """Ids of a source sentence, without EOS."""
    return self._encode(self._source, text)

  def encode_target(self, text: str) -> list[int]:
    """Ids of a target sentence, without EOS."""
    return self._encode(self._target, text)

  def encode_batch(self, texts) -> list[list[int]]:
    """`encode` of each of `texts`."""
    return [self.encode(text) for text in texts]

  def encode_target_batch(self, texts) -> list[list[int]]:
    """`encode_target` of each of `texts`."""
    return [self.encode_target(text) for text in texts]

  def decode(self, ids) -> str:
    """Text of target ids, stopping at the first EOS, leaving out PAD and UNK: as Marian's
    tokenizer decodes with `skip_special_tokens` (through `source.spm`, for one shared
    `vocab.json`, with any piece that model lacks joined as it is)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if EOS_ID in ids:
      ids = ids[: ids.index(EOS_ID)]
    pieces = [self._pieces[i] for i in ids if i not in (PAD_ID, UNK_ID)]
    return self._source.decode_pieces(pieces).replace(WORD_START, " ").strip()

  def __getstate__(self):
    return {"files": self.files, "path": self.path}

  def __setstate__(self, state):
    self.__init__(state["files"], state["path"])
