"""`TokenTable.batch` against `pipeline.layout`, the per-pair loop it replaces on the training
path: random tables, rows packed with several pairs in a random order, empty rows, caps that
cut either side."""

import os
import pickle

import numpy as np
import pytest

from transformer_jax.conventions import BATCH_KEYS
from transformer_jax.data import pipeline
from transformer_jax.data.token_table import TokenTable


def _table(seed, pairs=60):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 12, size=(pairs, 2)).astype(np.int32)
  return TokenTable(lengths, rng.integers(3, 500, size=int(lengths.sum())).astype(np.uint16))


def _examples(table, pairs, caps):
  """Each pair's (source ids, target ids) cut to `caps`, sliced out of the table by hand."""
  starts = np.concatenate([[0], np.cumsum(table.lengths.sum(axis=1))])
  out = []
  for i in pairs:
    source, target = (int(n) for n in table.lengths[i])
    ids = table.ids[starts[i] : starts[i + 1]].tolist()
    out.append((ids[:source][: caps[0]], ids[source:][: caps[1]]))
  return out


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_laid_out_from_the_table_equals_the_layout_of_its_pairs(seed):
  table = _table(seed)
  rng = np.random.default_rng(100 + seed)
  caps = (int(rng.integers(3, 12)), int(rng.integers(3, 12)))
  num_rows, per_row = 6, 3
  count = 0 if seed == 0 else int(rng.integers(1, 14))  # No pair: a host's share may be none.
  pairs = rng.choice(len(table.lengths), size=count, replace=False)
  rows = rng.permutation(np.repeat(np.arange(num_rows - 1), per_row))[: len(pairs)]  # last empty
  length = per_row * max(caps)
  got = table.batch(pairs, rows, num_rows, length, caps)
  want = pipeline.layout(_examples(table, pairs, caps), rows, num_rows, length)
  assert set(got) == set(BATCH_KEYS)
  for key in BATCH_KEYS:
    assert got[key].dtype == np.int32 and got[key].shape == (num_rows, length), key
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_a_row_that_cannot_hold_its_pairs_is_an_error():
  table = TokenTable(np.array([[3, 2], [4, 1]], np.int32), np.arange(10, dtype=np.uint16))
  with pytest.raises(ValueError, match="inputs of row 1 needs more than 6 tokens"):
    table.batch([0, 1], [1, 1], 2, 6, (10, 10))


def test_ids_that_do_not_match_the_lengths_are_refused():
  with pytest.raises(ValueError, match="9 ids for 10 tokens of the lengths"):
    TokenTable(np.array([[3, 2], [4, 1]], np.int32), np.arange(9, dtype=np.uint16))


def test_a_table_mapped_from_its_file_is_mapped_again_where_it_is_unpickled(tmp_path):
  table = _table(0)
  path = tmp_path / "ids.npy"
  np.save(path, table.ids)
  mapped = TokenTable(table.lengths, np.load(path, mmap_mode="r"), str(path))
  state = pickle.dumps(mapped)
  assert len(pickle.dumps(table)) - len(state) > table.ids.nbytes // 2  # The ids stay in the file.
  copy = pickle.loads(state)
  np.testing.assert_array_equal(copy.ids, table.ids)
  pairs, rows = [3, 7, 1], [0, 1, 0]
  for key, value in copy.batch(pairs, rows, 2, 30, (9, 9)).items():
    np.testing.assert_array_equal(value, table.batch(pairs, rows, 2, 30, (9, 9))[key])
  in_memory = pickle.loads(pickle.dumps(table))  # No file: the ids travel.
  np.testing.assert_array_equal(in_memory.ids, table.ids)
  np.save(tmp_path / "other.npy", table.ids[:-1])  # Another table's, put there after the pickle
  os.replace(tmp_path / "other.npy", path)  # (replaced, as a mapped file must be: never written).
  with pytest.raises(ValueError, match=r"ids\.npy changed since it was read"):
    pickle.loads(state)
