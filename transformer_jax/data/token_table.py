"""`TokenTable`: every training pair's token ids in one flat array, from which a batch is laid out
with a few array operations, without reading or tokenizing text (`lengths.token_table` makes it
and caches it beside the vocabulary)."""

import dataclasses

import numpy as np

from transformer_jax.conventions import BATCH_KEYS


@dataclasses.dataclass(frozen=True, eq=False)
class TokenTable:
  """Every pair of a split tokenized: `lengths` [pairs, 2] (source, target; EOS included) and
  `ids`, each pair's source ids then its target ids, pair after pair. Where `path` names the
  cached file it was memory-mapped from, a copy in another process (a Grain worker) maps the
  file again rather than carry the ids."""

  lengths: np.ndarray
  ids: np.ndarray
  path: str | None = None

  def __post_init__(self):
    _check(self.ids, self.lengths, "the lengths")
    # A plain view of a memory map: slicing an np.memmap costs a Python call per slice.
    object.__setattr__(self, "ids", self.ids.view(np.ndarray))
    ends = np.cumsum(self.lengths.sum(axis=1), dtype=np.int64)
    object.__setattr__(self, "_starts", ends - self.lengths.sum(axis=1))

  def batch(self, pairs, rows, num_rows: int, length: int, caps) -> dict:
    """The batch dict [num_rows, length] of the pairs `pairs` (indices in the split) placed in
    `rows`, a row's pairs packed in the order given, each side cut to `caps` = (max source, max
    target): what `pipeline.layout` makes of those pairs tokenized from their text."""
    pairs, rows = np.asarray(pairs, np.int64), np.asarray(rows, np.int64)
    batch = {k: np.zeros((num_rows, length), np.int32) for k in BATCH_KEYS}
    by_row = np.argsort(rows, kind="stable")
    first = np.searchsorted(rows[by_row], rows[by_row])  # where each pair's row begins in by_row
    segment = np.empty(len(rows), np.int64)
    segment[by_row] = np.arange(len(rows)) - first + 1
    for side, key in enumerate(("inputs", "targets")):
      counts = np.minimum(self.lengths[pairs, side], caps[side]).astype(np.int64)
      before = np.cumsum(counts[by_row]) - counts[by_row]  # tokens of earlier pairs, any row
      start = np.empty(len(rows), np.int64)
      start[by_row] = before - before[first]
      if len(rows) and (too_long := start + counts > length).any():
        row = rows[too_long.argmax()]
        raise ValueError(f"{key} of row {row} needs more than {length} tokens")
      pair = np.repeat(np.arange(len(rows)), counts)  # each token's pair
      position = np.arange(len(pair)) - np.repeat(np.cumsum(counts) - counts, counts)
      offset = self._starts[pairs] + (self.lengths[pairs, 0] if side else 0)
      where = rows[pair], start[pair] + position
      batch[key][where] = self.ids[offset[pair] + position]
      batch[f"{key}_segmentation"][where] = segment[pair]
      batch[f"{key}_position"][where] = position
    return batch

  def __getstate__(self):
    return {**self.__dict__, "ids": None} if self.path else self.__dict__

  def __setstate__(self, state):
    if state["ids"] is None:
      ids = np.load(state["path"], mmap_mode="r").view(np.ndarray)
      _check(ids, state["lengths"], f"the lengths: {state['path']} changed since it was read")
      state = {**state, "ids": ids}
    self.__dict__.update(state)


def _check(ids, lengths, what: str) -> None:
  if ids.size != int(lengths.sum()):
    raise ValueError(f"{ids.size} ids for {int(lengths.sum())} tokens of {what}")
