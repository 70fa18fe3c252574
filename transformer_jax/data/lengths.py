"""The length table and the token table of a split: every pair's token counts (EOS included) on
both sides, and every pair's token ids, made in one pass over the text (in Grain worker processes,
if asked) and cached beside the vocabulary. The batch plans are made from the lengths alone; the
training batches are laid out from the ids, without reading or tokenizing text again."""

import hashlib
import io
import itertools
import logging

import grain
import numpy as np
from absl import flags  # Grain reads its settings from these flags.
from etils import epath

from transformer_jax import fileio
from transformer_jax.conventions import EOS_ID
from transformer_jax.data.token_table import TokenTable
from transformer_jax.errors import FieldError

log = logging.getLogger(__name__)

CHUNK = 4096  # pairs read and tokenized at a time when making the tables


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


class _TokenizeChunk:
  """One chunk of the split tokenized: its token counts [(source, target)] (EOS included) and,
  with `keep_ids`, its ids flat (each pair's source then target) as the bytes of int32s.

  A list and bytes rather than arrays: Grain would pass arrays through shared memory.
  """

  def __init__(self, source, tokenizer, keep_ids=False):
    self.source, self.tokenizer, self.keep_ids = source, tokenizer, keep_ids

  def __call__(self, chunk):
    ids = range(chunk * CHUNK, min((chunk + 1) * CHUNK, len(self.source)))
    pairs = tokenize_pairs(self.tokenizer, self.source.pairs(ids))
    counts = [(len(s), len(t)) for s, t in pairs]
    if not self.keep_ids:
      return counts, b""
    flat = itertools.chain.from_iterable(s + t for s, t in pairs)
    return counts, np.fromiter(flat, np.int32).tobytes()


def _cache(source, tokenizer, kind: str) -> epath.Path | None:
  """Where the `kind` table ('lengths' or 'ids') of `source` tokenized by `tokenizer` is kept:
  beside the vocabulary file, None for a tokenizer without one."""
  if not tokenizer.path:
    return None
  key = hashlib.sha1(f"{source.fingerprint}|{tokenizer.digest}".encode()).hexdigest()[:20]
  name = f"{key}.npy" if kind == "lengths" else f"{key}.{kind}.npy"
  return epath.Path(fileio.absolute(tokenizer.path)).parent / "lengths" / name


def _load(cache: epath.Path | None, mmap: bool = False) -> np.ndarray | None:
  """The table cached in `cache`, if there is one; memory-mapped where asked and local."""
  if cache is None or not cache.exists():
    return None
  if mmap and not fileio.is_url(str(cache)):
    return np.load(str(cache), mmap_mode="r")
  with cache.open("rb") as file:
    return np.load(file)


def _save(cache: epath.Path | None, table: np.ndarray) -> bool:
  """Whether `table` was written to `cache`."""
  if cache is None:
    return False
  content = io.BytesIO()
  np.save(content, table)
  try:
    fileio.write_atomically(str(cache), content.getvalue())  # Hosts sharing the directory agree.
  except OSError as e:  # e.g. a read-only shared vocabulary directory
    log.warning("Could not cache the %s table in %s: %s", cache.name, cache, e)
    return False
  return True


def _tokenize_split(source, tokenizer, num_workers, keep_ids=False):
  """(lengths [pairs, 2], with `keep_ids` the ids flat in the smallest of uint16 and int32 that
  holds them, else None) of every pair of `source`."""
  log.info("Counting the tokens of %d pairs (%s)", len(source), source.fingerprint)
  chunks = (
    grain.MapDataset.range(-(-len(source) // CHUNK))
    .map(_TokenizeChunk(source, tokenizer, keep_ids))
    .to_iter_dataset()
  )
  if num_workers:
    chunks = chunks.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
  it = iter(chunks)
  counts, ids = [], []
  try:
    for chunk_counts, chunk_ids in it:
      counts.extend(chunk_counts)
      if keep_ids:
        ids.append(np.frombuffer(chunk_ids, np.int32))
  finally:
    it.close()
  lengths = np.array(counts, np.int32).reshape(-1, 2)
  if not keep_ids:
    return lengths, None
  dtype = np.uint16 if max((int(c.max()) for c in ids if c.size), default=0) < 2**16 else np.int32
  return lengths, np.concatenate(ids, dtype=dtype, casting="unsafe") if ids else np.zeros(0, dtype)


def _cached_lengths(source, cache: epath.Path | None) -> np.ndarray | None:
  """The length table cached in `cache`, if it is there and fits `source`."""
  lengths = _load(cache)
  return lengths if lengths is not None and lengths.shape == (len(source), 2) else None


def pair_lengths(source, tokenizer, num_workers=0):
  """[pairs, 2] token counts (EOS included) of a split; cached beside the vocabulary file."""
  require_grain_flags(num_workers)
  cache = _cache(source, tokenizer, "lengths")
  if (lengths := _cached_lengths(source, cache)) is not None:
    return lengths
  lengths, _ = _tokenize_split(source, tokenizer, num_workers)
  _save(cache, lengths)
  return lengths


def token_table(source, tokenizer, num_workers=0) -> TokenTable:
  """The `TokenTable` of a split: both tables cached beside the vocabulary file, made in one pass
  where either is missing or does not fit the split."""
  require_grain_flags(num_workers)
  caches = _cache(source, tokenizer, "lengths"), _cache(source, tokenizer, "ids")
  if table := _cached_table(source, caches):
    return table
  lengths, ids = _tokenize_split(source, tokenizer, num_workers, keep_ids=True)
  # Tables another host wrote meanwhile are kept: a file that processes map is never replaced
  # (on a network file system their maps could go stale).
  if table := _cached_table(source, caches):
    return table
  if _save(caches[0], lengths) and _save(caches[1], ids) and not fileio.is_url(str(caches[1])):
    return TokenTable(lengths, np.load(str(caches[1]), mmap_mode="r"), str(caches[1]))
  return TokenTable(lengths, ids)


def _cached_table(source, caches) -> TokenTable | None:
  """The token table cached in `caches` (lengths, ids), if both are there and fit `source`."""
  lengths = _cached_lengths(source, caches[0])
  if lengths is None:
    return None
  ids = _load(caches[1], mmap=True)
  if ids is None or ids.size != int(lengths.sum()):
    return None
  return TokenTable(lengths, ids, str(caches[1]) if isinstance(ids, np.memmap) else None)
