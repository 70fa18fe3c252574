"""What a search carries from step to step for any model, and how beam search reorders it.

A model's cache has two parts, told apart by where they are, not by names:
`shared`, one copy per sentence that every hypothesis of the sentence reads
(an encoder's output, cross-attention keys and values, a step counter), and
`rows`, one slice per hypothesis along `row_axis` (self-attention keys and
values), which beam search reorders when it picks its beams.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax


@flax.struct.dataclass
class SearchCache:
  """A model's decoding state, as the searches carry it.

  shared: any pytree; the search passes it on from step to step and never reorders it.
  rows: any pytree whose arrays have one row per hypothesis on axis `row_axis`
    (`[batch * beams]` rows, the beams of a sentence next to each other); reordered with them.
  row_axis: the hypotheses' axis of the `rows` arrays (1 where a scanned stack of layers
    puts its layers axis first).
  position_axis: the axis of the `rows` arrays that holds one entry per decoded position,
    written in order (a key/value buffer), or None. With it, beam search moves only the
    positions written so far; without, whole rows.
  """

  shared: Any
  rows: Any
  row_axis: int = flax.struct.field(pytree_node=False, default=0)
  position_axis: int | None = flax.struct.field(pytree_node=False, default=None)


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


def reorder_cache(cache: SearchCache, indices, *, length=None) -> SearchCache:
  """Reorder the hypotheses of every sentence in `cache.rows` by beam `indices` `[b, k]`.

  `cache.shared` stays as it is. `length` (an int32 scalar, may be traced):
  with a `position_axis`, only the first `length` positions hold entries
  yet, so only those (rounded up to `REORDER_CHUNK`) are moved; the rest are
  never read before they are written. A beam step that moves the whole
  buffer spends most of its time copying positions that decoding has not
  reached. A buffer that is not a multiple of `REORDER_CHUNK` is moved whole.
  """
  b, k = indices.shape
  row_axis, position_axis = cache.row_axis, cache.position_axis

  def reorder(x):
    rows = jnp.moveaxis(x, row_axis, 0)
    rows = gather_beams(rows.reshape((b, k) + rows.shape[1:]), indices).reshape(rows.shape)
    return jnp.moveaxis(rows, 0, row_axis)

  leaves, treedef = jax.tree_util.tree_flatten(cache.rows)
  if (
    length is None
    or position_axis is None
    or any(x.shape[position_axis] % REORDER_CHUNK for x in leaves)
  ):
    moved = [reorder(x) for x in leaves]
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
    moved = lax.fori_loop(0, chunks, reorder_chunk, leaves)
  return cache.replace(rows=jax.tree_util.tree_unflatten(treedef, moved))
