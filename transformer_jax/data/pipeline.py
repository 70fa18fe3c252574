"""Grain input pipeline: token-count batches or packed rows, per-host shards, exact resume.

A batch is a dict of numpy int32 arrays, all [rows, length]:
  inputs, targets                          token ids, EOS appended, 0-padded
  inputs_segmentation, targets_segmentation 1, 2, ... per pair in the row; 0 on padding
  inputs_position, targets_position        position inside its own pair; 0 on padding
Targets are not shifted (the model does it).

The training stream, deterministic from the seed:
  1. A length table: the token count (EOS included) of both sides of every
     training pair, and a token table of their ids, made once and cached beside
     the vocabulary. Over-long pairs are dropped or cut here, counted and logged.
  2. `MapDataset.range(pairs).shuffle(seed).repeat()` (a new order every
     epoch), cut into windows of `data.batch.window` pairs. Each window becomes a plan
     of global batches from the lengths alone: 'tokens' mode sorts the pairs
     into length buckets, 'packed' mode packs them first-fit-decreasing into
     rows; the batches are shuffled; every host keeps its rows of every batch.
     As plans depend on lengths only, all hosts agree on each step's shape
     while reading disjoint pairs. With `data.vocab.bpe_dropout`, every host first
     samples the window's segmentations (`bpe_dropout.PairSampler`, from the
     seed and the window) and plans on their lengths.
  3. A Grain flat-map yields one plan per step; the host then lays out its
     pairs, their ids taken from the token table (unless sampled): no text is
     read or tokenized while training. The iterator state is (window,
     batch in window).
"""

import dataclasses
import fractions
import logging
import math

import grain
import numpy as np

from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.data import bpe_dropout, sources
from transformer_jax.data import lengths as lengths_lib
from transformer_jax.data.config import BPE_DROPOUT_SIDES, DataConfig
from transformer_jax.data.errors import DataError
from transformer_jax.errors import FieldError

log = logging.getLogger(__name__)


def _next_length(length, growth=1.25):
  """The padded length after `length`: about `growth` times it, a multiple of 8, at least 8 more."""
  exact = fractions.Fraction(growth).limit_denominator(1000) * length / 8  # No float rounding up.
  return max(length + 8, math.ceil(exact) * 8)


def bucket_lengths(max_length, growth=1.25):
  """The padded lengths of 'tokens' mode up to `max_length`: 8, 16, 24, 32, 40, 56, 72, 96, ...
  (each about `growth` times the one before)."""
  out, length = [], 8
  while length < max_length:
    out.append(length)
    length = _next_length(length, growth)
  return tuple(out) + (max_length,)


def train_batch_shapes(c: DataConfig, shard_count=1):
  """The `(global rows, length)` of every batch shape that training on `c` can produce
  over `shard_count` data-loading processes, shortest first: a function of the batch settings
  alone (no data is read). FieldError when the longest bucket gets no rows or packed rows do not
  split over the shards; `make_train_loader` checks this before it reads any data."""
  multiple = rows_multiple(c, 0, shard_count)
  if c.batch.mode == "packed":
    if c.batch.size % multiple:
      raise FieldError(
        "data.batch",
        "size",
        f"={c.batch.size} must be a multiple of {multiple} (data.batch.multiple x shard count).",
      )
    return [(c.batch.size, c.batch.max_length)]
  b = c.batch
  longest = max(b.max_source_length, b.max_target_length)
  buckets = bucket_lengths(longest, b.bucket_growth) if b.mode == "tokens" else (longest,)
  rows = [b.tokens // length // multiple * multiple for length in buckets]
  if not rows[-1]:
    raise FieldError(
      "data.batch",
      "tokens",
      f"={c.batch.tokens} is too small: the longest "
      f"bucket ({buckets[-1]} tokens) needs at least {buckets[-1] * multiple} "
      f"for {multiple} rows (data.batch.multiple x shard count).",
    )
  return list(zip(rows, buckets))


def padded_length(n):
  """The smallest length of the unbounded series 8, 16, ..., 96, 120, ... that holds n tokens."""
  length = 8
  while length < n:
    length = _next_length(length)
  return length


@dataclasses.dataclass(frozen=True)
class Plan:
  """One host's part of one batch: which pairs go in which row.

  ids[i] (a pair index in the split) goes into row rows[i]; pairs sharing a row
  are packed in the order given. examples[i], when given, are its (source, target) token ids
  (sampled segmentations); otherwise they come from the split's token table.
  """

  length: int
  num_rows: int
  ids: np.ndarray
  rows: np.ndarray
  examples: tuple | None = None


def layout(examples, rows, num_rows, length):
  """The batch dict [num_rows, length] of (source ids, target ids) examples placed in `rows`."""
  batch = {k: np.zeros((num_rows, length), np.int32) for k in BATCH_KEYS}
  cursor = {"inputs": np.zeros(num_rows, np.int64), "targets": np.zeros(num_rows, np.int64)}
  segment = np.zeros(num_rows, np.int32)
  for (src, tgt), row in zip(examples, rows):
    segment[row] += 1
    for key, ids in (("inputs", src), ("targets", tgt)):
      start = cursor[key][row]
      end = start + len(ids)
      if end > length:
        raise ValueError(
          f"{key} of row {row} needs {end} tokens, more than {length}: "
          "the length table does not match the tokenizer."
        )
      batch[key][row, start:end] = ids
      batch[key + "_segmentation"][row, start:end] = segment[row]
      batch[key + "_position"][row, start:end] = np.arange(len(ids))
      cursor[key][row] = end
  return batch


class _Planner:
  """Window of pair positions -> this host's Plans of the window's global batches.

  With a `sampler` (`bpe_dropout.PairSampler`), every host samples the whole window's segmentations
  and plans on their lengths; each Plan then carries its pairs' tokens.
  """

  def __init__(self, lengths, ids, seed, shard_index, shard_count, sampler=None):
    self.lengths, self.ids, self.seed = lengths, ids, seed
    self.shard_index, self.shard_count = shard_index, shard_count
    self.sampler = sampler

  def __call__(self, window_index, positions):
    ids = self.ids[positions]
    rng = np.random.default_rng([self.seed, window_index])
    if self.sampler is None:
      examples, lengths = None, self.lengths[ids]
    else:
      examples = self.sampler(window_index, ids)
      lengths = np.array([(len(s), len(t)) for s, t in examples], np.int64).reshape(-1, 2)
    # Batches hold positions in the window; host_part turns them into pair ids.
    batches = self.global_batches(np.arange(len(ids)), lengths, rng)
    return [self.host_part(batches[i], ids, examples) for i in rng.permutation(len(batches))]

  def host_part(self, batch, ids, examples):
    """The rows of `batch` = (length, num_rows, window positions, rows) that belong to this host."""
    length, num_rows, members, rows = batch
    local = num_rows // self.shard_count
    lo = self.shard_index * local
    mine = (rows >= lo) & (rows < lo + local)
    kept = None if examples is None else tuple(examples[i] for i in members[mine])
    return Plan(length, local, ids[members[mine]], rows[mine] - lo, kept)

  def global_batches(self, positions, lengths, rng):
    """[(length, rows, window positions, row of each)] of the window's global batches."""
    raise NotImplementedError


class _TokenPlanner(_Planner):
  """'tokens' mode: pairs sorted into length buckets, rows * length <= tokens_per_batch.

  A bucket's leftover pairs (too few for a full batch) move up to the next
  bucket, so only the last bucket of a window leaves a partial batch (padded
  with empty rows).
  """

  def __init__(self, buckets, rows_per_bucket, **kwargs):
    super().__init__(**kwargs)
    self.buckets, self.rows_per_bucket = np.asarray(buckets), rows_per_bucket

  def global_batches(self, positions, lengths, rng):
    del rng
    bucket = np.searchsorted(self.buckets, lengths.max(axis=1))
    batches, carry = [], positions[:0]
    for b, length in enumerate(self.buckets):
      members = np.concatenate([carry, positions[bucket == b]])
      rows = self.rows_per_bucket[b]
      full = len(members) // rows * rows
      for start in range(0, full, rows):
        batches.append((int(length), rows, members[start : start + rows], np.arange(rows)))
      carry = members[full:]
    if len(carry):  # a partial batch of the last bucket, padded with empty rows
      batches.append(
        (int(self.buckets[-1]), self.rows_per_bucket[-1], carry, np.arange(len(carry)))
      )
    return batches


class _PackPlanner(_Planner):
  """'packed' mode: first-fit-decreasing into rows of `max_length` tokens per side."""

  def __init__(self, max_length, batch_size, **kwargs):
    super().__init__(**kwargs)
    self.max_length, self.batch_size = max_length, batch_size

  def global_batches(self, positions, lengths, rng):
    order = np.argsort(-lengths.max(axis=1), kind="stable")
    free = np.empty((len(positions), 2), np.int64)  # free tokens (source, target) per row
    row_of = np.empty(len(positions), np.int64)
    num_rows = 0
    for i in order:
      ok = (free[:num_rows, 0] >= lengths[i, 0]) & (free[:num_rows, 1] >= lengths[i, 1])
      row = int(ok.argmax()) if num_rows and ok.any() else num_rows
      if row == num_rows:
        free[row] = self.max_length
        num_rows += 1
      free[row] -= lengths[i]
      row_of[i] = row
    # Shuffle the rows, then cut them into batches; pairs keep their packing order.
    new_row = rng.permutation(num_rows)[row_of[order]]
    positions = positions[order]
    batches = []
    for start in range(0, num_rows, self.batch_size):
      mine = (new_row >= start) & (new_row < start + self.batch_size)
      batches.append((self.max_length, self.batch_size, positions[mine], new_row[mine] - start))
    return batches


class _Unpack(grain.experimental.FlatMapTransform):
  """A window's list of Plans -> one Plan per element."""

  max_fan_out = 1 << 20

  def flat_map(self, element):
    return element


class _Build:
  """Plan -> batch dict: this host's pairs laid out (from the token table, unless sampled)."""

  def __init__(self, table, caps):
    self.table, self.caps = table, caps

  def __call__(self, plan):
    if plan.examples is None:
      return self.table.batch(plan.ids, plan.rows, plan.num_rows, plan.length, self.caps)
    return layout(plan.examples, plan.rows, plan.num_rows, plan.length)


def rows_multiple(c, shard_index, shard_count):
  """Global batch rows come in multiples of this: `data.batch.multiple` and the shard count.
  ValueError for a shard that is not one of `shard_count`."""
  if not (
    isinstance(shard_count, int)
    and shard_count >= 1
    and isinstance(shard_index, int)
    and 0 <= shard_index < shard_count
  ):
    raise ValueError(
      f"shard_index={shard_index!r}, shard_count={shard_count!r}: "
      "need 0 <= shard_index < shard_count."
    )
  return math.lcm(c.batch.multiple, shard_count)


def make_train_loader(c: DataConfig, tokenizer, *, seed, shard_index, shard_count):
  """The endless training stream of this host's batches, as a Grain IterDataset.

  `iter(loader)` is a `grain.DatasetIterator`; checkpoint it with Orbax:
  save `grain.checkpoint.CheckpointSave(iterator)` and restore
  `grain.checkpoint.CheckpointRestore(iterator)` (of a fresh iterator of a
  loader made with the same config, seed and shards) in an
  `orbax.checkpoint.args.Composite`; the restored iterator yields exactly the
  batches the saved one would have. Sizes in the config are global: each of
  the `shard_count` hosts gets 1/shard_count of every batch's rows, and all
  hosts get the same shapes at every step. Resume with the same
  `data.batch.num_workers`: it changes the order of batches. Workers are spawned
  processes, so the main program must be an importable file, not stdin, and
  Grain starts them only where the command-line flags are parsed (FieldError
  otherwise: `lengths.require_grain_flags`).
  """
  rows_multiple(c, shard_index, shard_count)  # A bad shard stops here.
  lengths_lib.require_grain_flags(c.batch.num_workers)
  shapes = train_batch_shapes(c, shard_count)
  if not (isinstance(seed, (int, np.integer)) and 0 <= seed < 2**32):
    raise ValueError(f"seed={seed!r}: need an integer in [0, 2**32).")
  source = sources.open_split(c, c.source.train_split)
  caps = np.array([c.batch.max_source_length, c.batch.max_target_length])
  sampler = None
  if c.vocab.bpe_dropout:  # A vocabulary it cannot use stops here, before the length table.
    sides = BPE_DROPOUT_SIDES[c.vocab.bpe_dropout_sides]
    p = c.vocab.bpe_dropout
    sampler = bpe_dropout.PairSampler(source, tokenizer, p, caps, int(seed), sides)
    log.info(
      "BPE-dropout %g on %s: every epoch segments the training pairs anew.",
      c.vocab.bpe_dropout,
      "both sides" if len(sides) == 2 else f"the {c.vocab.bpe_dropout_sides} side",
    )
  workers = c.batch.num_workers  # With a sampler, windows sample their ids: no token table.
  table = None if sampler else lengths_lib.token_table(source, tokenizer, workers)
  lengths = lengths_lib.pair_lengths(source, tokenizer, workers) if sampler else table.lengths
  overlong = (lengths > caps).any(axis=1)
  log.info(
    "%s: %d of %d training pairs exceed %d source / %d target tokens: %s.",
    c.source.name,
    overlong.sum(),
    len(lengths),
    *caps,
    "dropped" if c.batch.overlong == "drop" else "truncated",
  )
  ids = np.flatnonzero(~overlong) if c.batch.overlong == "drop" else np.arange(len(lengths))
  if not len(ids):
    raise DataError(
      f"No training pair of {c.source.name} fits data.batch.max_source_length / max_target_length."
    )
  lengths = np.minimum(lengths, caps)
  common = dict(
    lengths=lengths,
    ids=ids,
    seed=int(seed),
    shard_index=shard_index,
    shard_count=shard_count,
    sampler=sampler,
  )
  if c.batch.mode in ("tokens", "padded"):
    planner = _TokenPlanner(
      [length for _, length in shapes], [rows for rows, _ in shapes], **common
    )
  else:
    planner = _PackPlanner(c.batch.max_length, c.batch.size, **common)
  plans = (
    grain.MapDataset.range(len(ids))
    .shuffle(int(seed))
    .repeat()
    .batch(c.batch.window)
    .map_with_index(planner)
    .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
  )
  batches = grain.experimental.FlatMapIterDataset(plans, _Unpack()).map(
    _Build(table, tuple(int(x) for x in caps))
  )
  if c.batch.num_workers:
    return batches.mp_prefetch(grain.MultiprocessingOptions(num_workers=c.batch.num_workers))
  return grain.experimental.ThreadPrefetchIterDataset(batches, prefetch_buffer_size=4)


def make_eval_batches(
  c: DataConfig, tokenizer, split, *, shard_index=0, shard_count=1, max_length: int | None = None
):
  """Every pair of `split` exactly once, in order, as a list of batches.

  Nothing is dropped. Batches have `data.batch.eval_size` global rows
  (this host: 1/shard_count of them, its consecutive share of each batch) and a
  length from the small series of `padded_length`, the same on every host,
  and at most `max_length` (the model's positions, `model.max_len`): a side
  of a pair longer than that is cut to it, with a warning that counts them.
  Rows past the end of the split (in the last batch) are all padding
  (segmentation 0). The texts of the split are `sources.split_texts`.
  """
  multiple = rows_multiple(c, shard_index, shard_count)
  if c.batch.eval_size % multiple:
    raise FieldError(
      "data.batch",
      "eval_size",
      f"={c.batch.eval_size} must be a multiple of {multiple} (data.batch.multiple x shard count).",
    )
  pairs = sources.open_split(c, split).all_pairs(lengths_lib.CHUNK)
  examples = lengths_lib.tokenize_pairs(tokenizer, pairs)
  if max_length is not None:
    if max_length < 1:
      raise ValueError(f"max_length={max_length}: need at least 1 position")
    cut = sum(max(len(s), len(t)) > max_length for s, t in examples)
    if cut:
      log.warning(
        "%s: %d of %d pairs have a side longer than the model's %d positions "
        "(model.max_len); their loss counts only the first %d tokens of it.",
        split,
        cut,
        len(examples),
        max_length,
        max_length,
      )
      examples = [(s[:max_length], t[:max_length]) for s, t in examples]
  local = c.batch.eval_size // shard_count
  out = []
  for start in range(0, len(pairs), c.batch.eval_size):
    stop = min(start + c.batch.eval_size, len(pairs))
    length = padded_length(max(max(len(s), len(t)) for s, t in examples[start:stop]))
    if max_length is not None:
      length = min(length, max_length)
    lo = min(start + shard_index * local, stop)
    hi = min(lo + local, stop)
    out.append(layout(examples[lo:hi], np.arange(hi - lo), local, length))
  return out
