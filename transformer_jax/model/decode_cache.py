"""The decoding cache's two kinds of entries, told apart the same way by both front doors.

An entry either holds one row per hypothesis (self-attention keys and values
so far, `[rows, heads, max_len, d]`), which beam search reorders with its
beams, or is the same for every hypothesis of a source sentence (the
cross-attention keys and values, projected once per sentence, and the
self-attention's write position), one copy that they all read. What an entry
is comes from where it is kept, never from its name:

  per row:       Linen's "cache" collection   NNX's `nnx.Cache`
  per sentence:  the "sentence_cache" one     `SentenceCache` (a subclass of `nnx.Cache`)

The pairs are Flax's own mapping of collections to variable types: "cache" is
`nnx.Cache`'s, and `SentenceCache` is registered as "sentence_cache"'s, so
`nnx.bridge` turns a Linen layer's entries into the NNX ones and back. A cache
entry of any other layer counts as per row. Linen decodes with both collections
mutable (`CACHE_COLLECTIONS`); NNX splits `SentenceCache` off first, then the
rest of `nnx.Cache` (`split_cache`).
"""

from flax import nnx

ROW_CACHE = "cache"
SENTENCE_CACHE = "sentence_cache"
CACHE_COLLECTIONS = (ROW_CACHE, SENTENCE_CACHE)


@nnx.register_variable_name(SENTENCE_CACHE)
class SentenceCache(nnx.Cache):
  """Decode state shared by the hypotheses of a sentence: the Linen "sentence_cache" collection."""


def split_cache(module: nnx.Module):
  """An NNX module's (graphdef, per-sentence state, per-row state, the rest)."""
  return nnx.split(module, SentenceCache, nnx.Cache, ...)
