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


def test_bits_are_the_hash_of_the_flat_index_which_wraps_past_two_to_the_32():
  # 3 x 2^31 elements: row 2 starts at index 2^32, which wraps to row 0's indices. XLA
  # computes only the slice asked for, so nothing of that size is materialized.
  key = jax.random.key(5)
  bits = np.asarray(jax.jit(lambda k: dropout.hashed_bits(k, (3, 2**31))[:, :64])(key))
  seeds = np.asarray(jax.random.bits(key, (2,), jnp.uint32))
  index = (np.arange(3, dtype=np.uint64)[:, None] * 2**31 + np.arange(64)) % 2**32
  with np.errstate(over="ignore"):
    expected = _mix32(_mix32(index.astype(np.uint32) ^ seeds[0]) + seeds[1])
  np.testing.assert_array_equal(bits, expected)
  np.testing.assert_array_equal(bits[2], bits[0])
  assert not np.array_equal(bits[1], bits[0])


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
