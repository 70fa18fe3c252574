"""Translating sentences with a trained model: lines in, the same number of lines out, in order.

`Translator` tokenizes sentences (cutting those longer than the model's
positions, with a warning naming the line), decodes them in batches of
similar length with beam search or greedy decoding, sharded along the batch
over the mesh, and returns the translations in input order. Lines without a
token (empty, or only spaces) translate to empty lines without decoding.
`read_lines` / `write_lines` are the file side of `--mode=translate`.
"""

import sys

from absl import logging
from etils import epath
import flax.linen as nn
import jax
from jax.experimental import multihost_utils
import numpy as np

from transformer_jax import decoding, sharding
from transformer_jax.data.pipeline import padded_length
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.errors import UserError


class Translator:
  """Translates with `model` (a `Transformer`) on `mesh`: beam search when `beam_size > 1`, else greedy.

  Sentences are sorted by length and decoded `batch_size` at a time. Batch
  rows are rounded up to a power of two (times the batch shards) and source
  lengths to the padded lengths of the data pipeline, and the output buffer
  follows from the source length, so only a few shapes compile. Sentence `i`
  gets at most its source tokens (EOS included) + `max_extra` output tokens
  (the paper: input length + 50), never more than the model's `max_len`.
  """

  def __init__(self, model, tokenizer, mesh, rules, *, beam_size: int = 4, alpha: float = 0.6,
               max_extra: int = 50, batch_size: int = 64):
    self.model, self.tokenizer = model, tokenizer
    self.mesh, self.rules = mesh, rules
    self.beam_size, self.alpha, self.max_extra = beam_size, alpha, max_extra
    self.batch_sharding = sharding.batch_sharding(mesh, rules)
    self.shards = sharding.num_batch_shards(dict(mesh.shape), rules)
    self.batch_size = -(-batch_size // self.shards) * self.shards

  @property
  def max_len(self) -> int:
    """Positions the model can encode: the most tokens (EOS included) a source or output may have."""
    return self.model.config.max_len

  def encode(self, lines) -> list[list[int]]:
    """Source ids of each line, EOS appended; `[]` for a line without tokens.

    A line with more tokens than `max_len` is cut to its first `max_len - 1`
    and EOS, with a warning naming the line (1-based).
    """
    sources = []
    for number, line in enumerate(lines, 1):
      ids = self.tokenizer.encode(line)
      if len(ids) >= self.max_len:
        logging.warning("line %d has %d tokens, more than the model's %d positions allow: "
                        "translating its first %d", number, len(ids) + 1, self.max_len,
                        self.max_len - 1)
        ids = ids[:self.max_len - 1]
      sources.append(ids + [EOS_ID] if ids else [])
    return sources

  def translate(self, params, lines) -> list[str]:
    """Translations of `lines` (strings), one per line, in order."""
    return [self.tokenizer.decode(ids) for ids in self.translate_ids(params, self.encode(lines))]

  def translate_ids(self, params, sources) -> list[list[int]]:
    """Output ids (EOS removed) of source id lists (EOS included), in order; `[]` for `[]`.

    Every process passes the same `sources` and gets every output back.
    """
    outputs = [[] for _ in sources]
    order = sorted((i for i, ids in enumerate(sources) if ids), key=lambda i: len(sources[i]))
    for start in range(0, len(order), self.batch_size):
      batch = order[start:start + self.batch_size]
      for i, ids in zip(batch, self._decode(params, [sources[i] for i in batch])):
        outputs[i] = ids
    return outputs

  def _decode(self, params, sources) -> list[list[int]]:
    """One batch: source id lists (at most `batch_size`, none longer than `max_len`) -> output ids."""
    rows = self.shards
    while rows < len(sources):
      rows *= 2
    rows = min(rows, self.batch_size)
    length = min(padded_length(max(len(ids) for ids in sources)), self.max_len)
    host = np.zeros((rows, length), np.int32)
    for row, ids in enumerate(sources):
      host[row, :len(ids)] = ids
    inputs = jax.make_array_from_callback(host.shape, self.batch_sharding, lambda index: host[index])
    buffer = min(padded_length(length + self.max_extra), self.max_len)
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      if self.beam_size > 1:
        out = decoding.beam_search(self.model, {"params": params}, inputs,
                                   beam_size=self.beam_size, alpha=self.alpha, max_len=buffer,
                                   max_extra=self.max_extra)
      else:
        out = decoding.greedy_decode(self.model, {"params": params}, inputs, max_len=buffer,
                                     max_extra=self.max_extra)
    tokens = multihost_utils.process_allgather(out.tokens, tiled=True)
    return decoding.trim(tokens)[:len(sources)]


def read_lines(path: str | None) -> list[str]:
  """The lines of the file at `path` (stdin for None or '-'), split at '\\n', as UTF-8 text.

  A final '\\n' ends the last line rather than starting an empty one. Raises
  UserError for an unreadable file, or naming the first line (1-based) that
  is not valid UTF-8.
  """
  name = "stdin" if path in (None, "-") else path
  try:
    raw = sys.stdin.buffer.read() if name == "stdin" else epath.Path(path).read_bytes()
  except OSError as error:
    raise UserError(f"cannot read the input {name}: {error.strerror}") from None
  pieces = raw.split(b"\n")
  if pieces[-1] == b"":
    pieces.pop()
  lines = []
  for number, piece in enumerate(pieces, 1):
    try:
      lines.append(piece.decode("utf-8"))
    except UnicodeDecodeError as error:
      raise UserError(
          f"{name}, line {number}: not valid UTF-8 (byte 0x{piece[error.start]:02x} at byte "
          f"{error.start + 1} of the line); the input must be UTF-8 text") from None
  return lines


def write_lines(path: str | None, lines) -> None:
  """Write `lines`, each ending in '\\n', as UTF-8 to the file at `path` (stdout for None or '-').

  Process 0 only. The file's directory is made if needed; `path` may be a URL
  such as gs://.
  """
  if jax.process_index() != 0:
    return
  data = "".join(line + "\n" for line in lines).encode("utf-8")
  if path in (None, "-"):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return
  try:
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
  except OSError as error:
    raise UserError(f"cannot write the output {path}: {error.strerror}") from None
