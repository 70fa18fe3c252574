"""BPE-dropout of training pairs (`data.vocab.bpe_dropout`; Provilkov, Emelianenko and Voita, ACL
2020): a new segmentation of every pair each time the training stream reads it, drawn from the seed
and the window alone, so that a resumed run and every host read the same tokens.

SentencePiece samples BPE-dropout too, but from a generator that its seed does not fix across
processes; this is its algorithm over the same pieces, driven by Python's own generator. Each
merge that SentencePiece's BPE would apply next is skipped with probability p; p = 0 gives exactly
SentencePiece's segmentation. Pure Python: about 70 us a sentence of the Multi30k tok text.
"""

import heapq
import random
import re

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from transformer_jax.conventions import EOS_ID, UNK_ID
from transformer_jax.data import lengths as lengths_lib
from transformer_jax.errors import FieldError

_PIECE = sentencepiece_model_pb2.ModelProto.SentencePiece
_WORD = re.compile("▁?[^▁]+|▁")  # a piece never spans a word boundary (see _unsupported)


def _unsupported(model) -> str | None:
  """What of SentencePiece's BPE a model uses that `BpeDropout` does not do, if anything: every
  vocabulary this project trains has none of it."""
  spec = model.trainer_spec
  if spec.model_type != spec.BPE:
    return "it is not a BPE vocabulary"
  for option in ("treat_whitespace_as_suffix", "allow_whitespace_only_pieces", "byte_fallback"):
    if getattr(spec, option):
      return f"it was trained with {option}"
  if not spec.split_by_whitespace:
    return "it was trained without split_by_whitespace"
  kinds = {_PIECE.USER_DEFINED: "user-defined symbols", _PIECE.UNUSED: "unused pieces"}
  for piece in model.pieces:
    if piece.type in kinds:
      return f"it has {kinds[piece.type]}"
  return None


class BpeDropout:
  """`encode(text, p, rng)`: token ids (no EOS) of `text` under a SentencePiece BPE model, each
  merge skipped with probability `p` (draws from `rng`, a `random.Random`).

  ValueError for a model with options it does not do (`_unsupported`), rather than other ids.
  """

  def __init__(self, model_proto: bytes):
    model = sentencepiece_model_pb2.ModelProto.FromString(model_proto)
    if reason := _unsupported(model):
      raise ValueError(reason)
    self.model_proto = model_proto
    self._ids = {p.piece: i for i, p in enumerate(model.pieces) if p.type == _PIECE.NORMAL}
    self._scores = {p.piece: p.score for p in model.pieces if p.type == _PIECE.NORMAL}
    self._normalizer = spm.SentencePieceProcessor(model_proto=model_proto)

  def encode(self, text, p, rng):
    ids = []
    for word in _WORD.findall(self._normalizer.normalize(text)):
      for piece in self._pieces(word, p, rng):
        i = self._ids.get(piece, UNK_ID)
        if not (i == UNK_ID and ids and ids[-1] == UNK_ID):  # unknown runs are one UNK
          ids.append(i)
    return ids

  def _pieces(self, word, p, rng):
    """SentencePiece's BPE merges of `word`, best-scored first (ties: leftmost), each one skipped
    with probability `p`; a skipped pair comes back only when a neighbour changes."""
    symbols = list(word)
    last = len(symbols) - 1
    prev, next_ = list(range(-1, last)), list(range(1, last + 2))
    next_[last] = -1
    agenda = []

    def add(left, right):
      piece = symbols[left] + symbols[right]
      score = self._scores.get(piece)
      if score is not None:
        heapq.heappush(agenda, (-score, left, right, len(piece)))

    for i in range(last):
      add(i, i + 1)
    while agenda:
      _, left, right, size = heapq.heappop(agenda)
      if not symbols[left] or not symbols[right]:
        continue
      if len(symbols[left]) + len(symbols[right]) != size:
        continue  # one side merged since this pair was added
      if rng.random() < p:
        continue
      symbols[left] += symbols[right]
      symbols[right] = ""
      next_[left] = next_[right]
      if next_[left] >= 0:
        prev[next_[left]] = left
        add(left, next_[left])
      if prev[left] >= 0:
        add(prev[left], left)
    return [s for s in symbols if s]

  def __getstate__(self):
    return {"model_proto": self.model_proto}

  def __setstate__(self, state):
    self.__init__(state["model_proto"])


class PairSampler:
  """(window index, pair ids) -> [(source ids, target ids)], EOS appended, under BPE-dropout `p`
  on `sides` (0 source, 1 target; the other side keeps its deterministic segmentation).

  A pair whose sample is longer than `caps` = (max source, max target) on either side gets its
  deterministic segmentation instead (cut to `caps`, as over-long pairs are when they are kept).
  """

  def __init__(self, source, tokenizer, p, caps, seed, sides=(0, 1)):
    name = tokenizer.path or "this vocabulary"
    if not hasattr(tokenizer, "model_proto"):
      _refuse(p, f"{name} is not one SentencePiece model (a Marian vocabulary)")
    try:
      self.dropout = BpeDropout(tokenizer.model_proto)
    except ValueError as error:
      _refuse(p, f"{name}: {error}")
    self.source, self.tokenizer, self.p, self.caps, self.seed = source, tokenizer, p, caps, seed
    self.sides = sides

  def __call__(self, window_index, ids):
    pairs = list(self.source.pairs(ids))
    rng = random.Random(int(np.random.SeedSequence([self.seed, window_index]).generate_state(1)[0]))
    plain = [
      None if side in self.sides else self.tokenizer.encode_batch([pair[side] for pair in pairs])
      for side in (0, 1)
    ]
    examples = [
      tuple(
        (self.dropout.encode(text, self.p, rng) if plain[side] is None else plain[side][k])
        + [EOS_ID]
        for side, text in enumerate(pair)
      )
      for k, pair in enumerate(pairs)
    ]
    overlong = [
      i for i, (s, t) in enumerate(examples) if len(s) > self.caps[0] or len(t) > self.caps[1]
    ]
    fallback = lengths_lib.tokenize_pairs(self.tokenizer, [pairs[i] for i in overlong], self.caps)
    for i, example in zip(overlong, fallback):
      examples[i] = example
    return examples


def _refuse(p, why):
  raise FieldError(
    "data.vocab",
    "bpe_dropout",
    f"={p} needs a SentencePiece BPE vocabulary as this project trains; {why}.",
  )
