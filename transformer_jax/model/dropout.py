"""Dropout whose keep decisions hash each element's index: fused by XLA, equal on any sharding."""

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


def hashed_bits(key, shape):
  """uint32 bits for every element of `shape`: a hash of the element's index and two words of `key`.

  Elementwise integer arithmetic on an iota, so XLA fuses it into its
  consumer (and recomputes it in the backward pass) instead of materializing
  a random array as `jax.random.bits` does; the result is the same on any
  sharding of `shape` (the index is global). Indices wrap past 2^32 elements.
  """
  seeds = jax.random.bits(key, (2,), jnp.uint32)
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % 2**32)
    stride *= shape[axis]
  return _mix32(_mix32(index ^ seeds[0]) + seeds[1])


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
