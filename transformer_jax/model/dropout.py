"""Dropout whose keep decisions hash each element's index: fused by XLA, equal on any sharding."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


def _mix32(h):
  """murmur3's 32-bit finalizer: a bijection of uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


_WORD = 2**32


def hashed_bits(key, shape):
  """uint32 bits for every element of `shape`: a hash of the element's index and two words of `key`.

  Elementwise integer arithmetic on an iota, so XLA fuses it into its
  consumer (and recomputes it in the backward pass) instead of materializing
  a random array as `jax.random.bits` does; the result is the same on any
  sharding of `shape` (the index is global). An array of more than 2^32
  elements hashes its index as two words, the trailing axes' index (under
  2^32) and the leading axes' (e.g. [batch, heads] of attention weights
  [batch, heads, q, k]), so its masks do not repeat. ValueError for a shape with
  an axis, or leading axes together, of more than 2^32 elements.
  """
  seeds = jax.random.bits(key, (2,), jnp.uint32)
  split = _split(shape)
  bits = _mix32(_mix32(_flat_index(shape, range(split, len(shape))) ^ seeds[0]) + seeds[1])
  if split == 0:
    return bits
  leading = _flat_index(shape, range(split))
  return _mix32(bits ^ _mix32(_mix32(leading ^ seeds[1]) + seeds[0]))


def _split(shape) -> int:
  """The first of the most trailing axes that hold at most 2^32 elements together (0 for any
  array of at most 2^32 elements); ValueError where the axes before it hold more than 2^32."""
  split, trailing = len(shape), 1
  while split > 0 and trailing * shape[split - 1] <= _WORD:
    split -= 1
    trailing *= shape[split]
  if math.prod(shape[:split]) > _WORD:
    raise ValueError(
      f"dropout over shape {tuple(shape)}: the leading axes {tuple(shape[:split])} hold more "
      "than 2^32 elements (the hash takes the index as two 32-bit words, one for the trailing "
      f"axes {tuple(shape[split:])}, one for the leading ones); reshape so that no axis, and no "
      "leading axes together, hold more than 2^32 elements"
    )
  return split


def _flat_index(shape, axes: range):
  """Every element's row-major index (uint32) over `axes` of `shape`."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(axes):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % _WORD)
    stride *= shape[axis]
  return index


def dropout(x, rate: float, key):
  """Inverted dropout: zero each element with probability `rate`, scale the rest by 1 / (1 - rate).

  The keep decision compares `hashed_bits` with `rate * 2^32`, instead of
  `nn.Dropout`'s threefry bits (materialized, and the masks rebuilt from them
  in the backward pass); what that saved is in docs/performance.md.
  """
  if rate == 0:
    return x
  if rate >= 1:
    return jnp.zeros_like(x)
  threshold = min(round(rate * 2**32), 2**32 - 1)
  keep = hashed_bits(key, x.shape) >= jnp.uint32(threshold)
  return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - rate), x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """`dropout` as a Flax module, called like `nn.Dropout(rate)(x, deterministic)`; its key comes
  from the "dropout" RNG stream."""

  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0:
      return x
    return dropout(x, self.rate, self.make_rng("dropout"))
