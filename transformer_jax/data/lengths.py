"""The length table of a split: every pair's token counts (EOS included) on both sides, counted
once (in Grain worker processes, if asked) and cached beside the vocabulary. The batch plans are
made from it alone."""

import hashlib
import io
import logging

import grain
import numpy as np
from absl import flags  # Grain reads its settings from these flags.
from etils import epath

from transformer_jax import fileio
from transformer_jax.conventions import EOS_ID
from transformer_jax.errors import FieldError

log = logging.getLogger(__name__)

CHUNK = 4096  # pairs read and tokenized at a time when counting lengths


def tokenize_pairs(tokenizer, pairs, caps=None):
  """[(source ids, target ids)] with EOS appended, cut to `caps` = (max source, max target)."""
  pairs = list(pairs)
  sources = tokenizer.encode_batch([src for src, _ in pairs])
  targets = tokenizer.encode_target_batch([tgt for _, tgt in pairs])
  out = []
  for s, t in zip(sources, targets):
    s, t = s + [EOS_ID], t + [EOS_ID]
    out.append((s, t) if caps is None else (s[: caps[0]], t[: caps[1]]))
  return out


def require_grain_flags(num_workers: int) -> None:
  """Grain starts its worker processes (`num_workers` > 0) only where the command-line flags
  (Abseil's, `flags` here) are parsed: it reads its settings from them. The command line has
  parsed them; any other caller parses them itself (`app.run`, or `flags.FLAGS.mark_as_parsed()`
  for Grain's defaults), since the process's flags are its own. FieldError naming
  data.batch.num_workers otherwise."""
  if num_workers and not flags.FLAGS.is_parsed():
    raise FieldError(
      "data.batch",
      "num_workers",
      f"={num_workers} starts Grain worker processes, which read their settings from the "
      f"command-line flags ({flags.__name__}), and this process has not parsed them: parse "
      f"them first, or call {flags.__name__}.FLAGS.mark_as_parsed() for Grain's defaults, or "
      "set data.batch.num_workers=0.",
    )


class _CountChunk:
  """Token counts [(source, target)] (EOS included) of the pairs of one chunk of the split.

  A list rather than an array: Grain would pass arrays through shared memory.
  """

  def __init__(self, source, tokenizer):
    self.source, self.tokenizer = source, tokenizer

  def __call__(self, chunk):
    ids = range(chunk * CHUNK, min((chunk + 1) * CHUNK, len(self.source)))
    return [(len(s), len(t)) for s, t in tokenize_pairs(self.tokenizer, self.source.pairs(ids))]


def pair_lengths(source, tokenizer, num_workers=0):
  """[pairs, 2] token counts (EOS included) of a split; cached beside the vocabulary file."""
  require_grain_flags(num_workers)
  cache = None
  if tokenizer.path:
    key = hashlib.sha1(f"{source.fingerprint}|{tokenizer.digest}".encode()).hexdigest()
    cache = epath.Path(fileio.absolute(tokenizer.path)).parent / "lengths" / f"{key[:20]}.npy"
    if cache.exists():
      with cache.open("rb") as file:
        lengths = np.load(file)
      if lengths.shape == (len(source), 2):
        return lengths
  log.info("Counting the tokens of %d pairs (%s)", len(source), source.fingerprint)
  chunks = (
    grain.MapDataset.range(-(-len(source) // CHUNK))
    .map(_CountChunk(source, tokenizer))
    .to_iter_dataset()
  )
  if num_workers:
    chunks = chunks.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  it = iter(chunks)
  try:
    lengths = np.array([n for chunk in it for n in chunk], np.int32).reshape(-1, 2)
  finally:
    it.close()
  if cache:
    table = io.BytesIO()
    np.save(table, lengths)
    try:
      fileio.write_atomically(str(cache), table.getvalue())  # Hosts sharing the directory agree.
    except OSError as e:  # e.g. a read-only shared vocabulary directory
      log.warning("Could not cache the length table in %s: %s", cache, e)
  return lengths
