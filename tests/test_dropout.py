"""Dropout: the drop rate, the scale, independence across elements and keys.

The same masks on any sharding is checked by tests/test_sharding.py (dropout 0.1,
sharded runs against one device)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model import dropout

pytestmark = pytest.mark.device

SHAPE = (32, 128, 128)  # 524,288 elements: a rate's standard error is below 5e-4.


def dropped(rate, seed, shape=SHAPE):
  return np.asarray(dropout.dropout(jnp.ones(shape), rate, jax.random.key(seed))) == 0


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_drops_at_the_rate_and_scales_the_rest(rate):
  out = np.asarray(dropout.dropout(jnp.ones(SHAPE), rate, jax.random.key(0)))
  standard_error = np.sqrt(rate * (1 - rate) / out.size)
  assert abs(np.mean(out == 0) - rate) < 5 * standard_error
  np.testing.assert_allclose(out[out != 0], 1 / (1 - rate), rtol=1e-6)
  assert abs(np.mean(out) - 1.0) < 5 * standard_error / (1 - rate), "the expectation is kept"


def test_rate_zero_is_the_identity_and_rate_one_zeros():
  x = jnp.arange(12.0).reshape(3, 4)
  assert dropout.dropout(x, 0.0, jax.random.key(0)) is x
  np.testing.assert_array_equal(dropout.dropout(x, 1.0, jax.random.key(0)), np.zeros((3, 4)))


def test_module_is_off_when_deterministic_and_draws_from_the_dropout_stream():
  x = jnp.ones((4, 8))
  module = dropout.Dropout(0.5)
  assert module.apply({}, x, True) is x
  a, b = (module.apply({}, x, False, rngs={"dropout": jax.random.key(s)}) for s in (1, 2))
  assert set(np.unique(a)) == {0.0, 2.0} and not np.array_equal(a, b)


def _mix32(h):
  """murmur3's 32-bit finalizer in numpy uint32 arithmetic."""
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> np.uint32(13))
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> np.uint32(16))


def _sliced_bits(key, shape, columns):
  """`hashed_bits(key, shape)[:, columns]`; XLA computes only the slice asked for, so nothing of
  `shape`'s size is materialized."""
  return np.asarray(jax.jit(lambda k: dropout.hashed_bits(k, shape)[:, columns])(key))


def test_up_to_two_to_the_32_elements_the_bits_are_the_hash_of_the_flat_index():
  # 2 x 2^31 elements: the last index is 2^32 - 1.
  key = jax.random.key(5)
  seeds = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
  for columns in (slice(0, 64), slice(2**31 - 64, 2**31)):
    bits = _sliced_bits(key, (2, 2**31), columns)
    index = np.arange(2, dtype=np.uint64)[:, None] * 2**31 + np.arange(
      columns.start, columns.stop, dtype=np.uint64
    )
    with np.errstate(over="ignore"):
      expected = _mix32(_mix32(index.astype(np.uint32) ^ seeds[0]) + seeds[1])
    np.testing.assert_array_equal(bits, expected)


def test_past_two_to_the_32_elements_the_leading_index_is_hashed_too_and_nothing_repeats():
  # 3 x 2^31 elements: row 2 starts at flat index 2^32, where one word of index would wrap to
  # row 0's. The leading axis's index is the second word.
  key = jax.random.key(5)
  bits = _sliced_bits(key, (3, 2**31), slice(0, 4096))
  seeds = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
  row, column = np.arange(3, dtype=np.uint32)[:, None], np.arange(4096, dtype=np.uint32)
  with np.errstate(over="ignore"):
    trailing = _mix32(_mix32(column ^ seeds[0]) + seeds[1])
    leading = _mix32(_mix32(row ^ seeds[1]) + seeds[0])
    np.testing.assert_array_equal(bits, _mix32(trailing ^ leading))
  for a, b in ((0, 1), (0, 2), (1, 2)):
    assert np.mean(bits[a] == bits[b]) < 0.01
    assert abs(np.mean((bits[a] < 2**31) & (bits[b] < 2**31)) - 0.25) < 0.03, "independent rows"


def test_each_word_is_the_flat_index_of_its_own_axes_and_a_trailing_word_reaches_two_to_the_32():
  key = jax.random.key(6)
  seeds = np.asarray(jax.random.bits(key, (2,), jnp.uint32))

  def expected(leading, trailing):
    with np.errstate(over="ignore"):
      low = _mix32(_mix32(trailing.astype(np.uint32) ^ seeds[0]) + seeds[1])
      return _mix32(low ^ _mix32(_mix32(leading.astype(np.uint32) ^ seeds[1]) + seeds[0]))

  # Two leading axes: their own flat index 3 * i + j, not the array's.
  bits = np.asarray(jax.jit(lambda k: dropout.hashed_bits(k, (2, 3, 2**31))[:, :, :64])(key))
  leading = (3 * np.arange(2)[:, None] + np.arange(3))[:, :, None]
  np.testing.assert_array_equal(bits, expected(leading, np.arange(64)))
  # A trailing word over exactly 2^32 elements: its last index is 2^32 - 1.
  bits = _sliced_bits(key, (2, 2**32), slice(2**32 - 64, 2**32))
  trailing = np.arange(2**32 - 64, 2**32, dtype=np.uint64)
  np.testing.assert_array_equal(bits, expected(np.arange(2)[:, None], trailing))


def test_where_the_axes_split_and_which_shapes_are_refused():
  split = dropout._split  # pylint: disable=protected-access
  assert [split(s) for s in [(), (4, 5), (1, 2**32), (3, 2**31), (2**32, 2, 2**31)]] == [
    0,
    0,
    0,
    1,
    1,
  ]
  assert split((0, 2**33)) >= 0 and split((2**33, 0)) == 0  # Empty arrays are not refused.
  key = jax.random.key(0)
  for shape in ((2**33,), (2**32 + 1, 2**32)):
    with pytest.raises(ValueError, match=r"^dropout over shape .* more than 2\^32 elements"):
      jax.eval_shape(lambda k, shape=shape: dropout.hashed_bits(k, shape), key)


def test_same_key_same_mask_other_key_independent_mask():
  a, b, c = dropped(0.5, 1), dropped(0.5, 1), dropped(0.5, 2)
  np.testing.assert_array_equal(a, b)
  assert abs(np.mean(a & c) - 0.25) < 0.004, "two keys' masks overlap as independent ones do"


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_neighbours_along_every_axis_are_independent(axis):
  mask = dropped(0.5, 3)
  first = np.take(mask, range(mask.shape[axis] - 1), axis=axis)
  second = np.take(mask, range(1, mask.shape[axis]), axis=axis)
  assert abs(np.mean(first & second) - 0.25) < 0.004


def test_every_bit_is_fair():
  bits = np.asarray(dropout.hashed_bits(jax.random.key(4), (1 << 18,)))
  ones = [(bits >> b & 1).mean() for b in range(32)]
  assert max(abs(p - 0.5) for p in ones) < 0.005
