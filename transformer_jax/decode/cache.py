"""The decoder's key/value cache as the searches use it: made once per batch, advanced one
token per step, and reordered when the beam search picks its beams."""

import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.conventions import PAD_ID

NEG_INF = -jnp.inf
# Cache entries projected once from the encoder output: identical for every
# beam of a sentence, so reordering beams leaves them alone.
STATIC_CACHE_NAMES = ("static_key", "static_value")


def init_cache(model, variables, encoded, inputs, max_len: int, rows: int | None = None):
  """Decoder cache for `rows` hypotheses (default: one per sentence) of `max_len` target positions,
  holding the cross-attention keys/values of each sentence once.

  `encoded` `[n, src_len, d_model]`, `inputs` `[n, src_len]`; `rows` a multiple of `n`, the
  hypotheses of each sentence next to each other.
  """
  targets = jnp.zeros((rows or inputs.shape[0], max_len), jnp.int32)
  _, mutated = model.apply(
    variables,
    encoded,
    inputs,
    targets,
    targets_position=jnp.zeros_like(targets),
    decode=True,
    method=model.decode,
    mutable=["cache"],
  )
  return mutated["cache"]


def decode_step(
  model, variables, cache, encoded, inputs, tokens, position, *, renormalize: bool = False
):
  """One cached decoder step: (log-probs `[n, vocab]`, new cache).

  `tokens` `[n]` are the previous outputs, fed at `position`; `n` is the cache's rows, a multiple
  of the sentences of `encoded` and `inputs`. Log-probabilities are float32, with the pad id set
  to -inf (never emitted): after the log-softmax, or before it with `renormalize`.
  """
  n = tokens.shape[0]
  logits, mutated = model.apply(
    {**variables, "cache": cache},
    encoded,
    inputs,
    tokens[:, None],
    targets_position=jnp.full((n, 1), position, jnp.int32),
    decode=True,
    method=model.decode,
    mutable=["cache"],
  )
  logits = logits[:, 0].astype(jnp.float32)
  if renormalize:
    return jax.nn.log_softmax(logits.at[:, PAD_ID].set(NEG_INF)), mutated["cache"]
  return jax.nn.log_softmax(logits).at[:, PAD_ID].set(NEG_INF), mutated["cache"]


def gather_beams(x, indices):
  """Pick beams per sentence: `x` `[b, k, ...]`, `indices` `[b, k']` -> `[b, k', ...]`.

  One `take_along_axis` over each beam's flattened row, which XLA copies as
  whole rows instead of indexing inside a `vmap` (docs/performance.md), and
  the beam search reorders its whole cache this way every step.
  """
  b, k = x.shape[:2]
  rows = jnp.take_along_axis(x.reshape(b, k, -1), indices[:, :, None], axis=1)
  return rows.reshape(indices.shape + x.shape[2:])


# Positions that `reorder_cache` moves at a time when it reorders only those written so far.
REORDER_CHUNK = 8


def reorder_cache(cache, indices, *, batch_axis: int = 0, length=None):
  """Reorder the `[b * k, heads, max_len, d]` cache rows of every sentence by beam `indices`
  `[b, k]`.

  The cache index and the cross-attention keys/values, which are the same for
  all beams of a sentence, are left as they are. `batch_axis` is 1 when the
  model scans its layers (cache entries then lead with a layers axis).
  `length` (an int32 scalar, may be traced): only the first `length`
  positions hold keys/values yet, so only those (rounded up to
  `REORDER_CHUNK`) are moved; the rest are never attended to before they are
  written. A beam step that moves the whole buffer spends most of its time
  copying positions that decoding has not reached. A buffer that is not a
  multiple of `REORDER_CHUNK` is moved whole.
  """
  b, k = indices.shape

  def reorder(x):
    rows = jnp.moveaxis(x, batch_axis, 0)
    rows = gather_beams(rows.reshape((b, k) + rows.shape[1:]), indices).reshape(rows.shape)
    return jnp.moveaxis(rows, 0, batch_axis)

  with_paths, treedef = jax.tree_util.tree_flatten_with_path(cache)
  leaves = [x for _, x in with_paths]
  moving = [
    i
    for i, (path, x) in enumerate(with_paths)
    if x.ndim > batch_axis and getattr(path[-1], "key", None) not in STATIC_CACHE_NAMES
  ]
  position_axis = batch_axis + 2
  if length is None or any(
    leaves[i].ndim <= position_axis or leaves[i].shape[position_axis] % REORDER_CHUNK
    for i in moving
  ):
    moved = [reorder(leaves[i]) for i in moving]
  else:

    def reorder_chunk(chunk, entries):
      start = chunk * REORDER_CHUNK
      return [
        lax.dynamic_update_slice_in_dim(
          x,
          reorder(lax.dynamic_slice_in_dim(x, start, REORDER_CHUNK, position_axis)),
          start,
          position_axis,
        )
        for x in entries
      ]

    chunks = (length + REORDER_CHUNK - 1) // REORDER_CHUNK
    moved = lax.fori_loop(0, chunks, reorder_chunk, [leaves[i] for i in moving])
  for i, x in zip(moving, moved):
    leaves[i] = x
  return jax.tree_util.tree_unflatten(treedef, leaves)
